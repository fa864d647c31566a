"""Where the benchmarks find real captures, and how a result names a machine's folders.

No torch import: scripts/gpu_records.py and scripts/build_gsplat_ext.py use it between GPU checks
and without the target torch.

The data folder (test_garden.npz, thermos/, ...) is $DISTSPLAT_DATA; without it, `shared/data`
beside the repository checkout, else the repository's .gpu_data/ (what scripts/gpu_prepare.sh
copies for the GPU machine); the tests find it here too (tests/conftest.py).

A result is a record others read on other machines: `neutral` writes the folders of the machine
that made it as placeholders ($DATA, $REPO, $DISTSPLAT_CACHE, $HOME), so no record names one
machine's absolute paths.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """The folder holding the real captures (it may not exist: callers say so)."""
    if os.environ.get("DISTSPLAT_DATA"):
        return Path(os.environ["DISTSPLAT_DATA"])
    for candidate in (REPO.parent / "shared" / "data", REPO / ".gpu_data"):
        if candidate.is_dir():
            return candidate
    return REPO.parent / "shared" / "data"


def _placeholders(extra: Dict[str, str]) -> List[Tuple[str, str]]:
    """(absolute folder, placeholder), the longest folder first so the most specific wins."""
    pairs = {**extra, str(data_dir()): "$DATA", str(REPO / ".gpu_data"): "$DATA",
             str(REPO.parent / "shared" / "data"): "$DATA",
             os.environ.get("DISTSPLAT_CACHE") or str(Path.home() / ".cache" / "distsplat"): "$DISTSPLAT_CACHE",
             str(REPO): "$REPO", str(Path.home()): "$HOME"}
    out = []
    for folder, name in pairs.items():
        for form in {folder, os.path.realpath(folder)}:
            if len(form) > 1:  # never "/"
                out.append((form, name))
    return sorted(out, key=lambda p: -len(p[0]))


def neutral(value: Any, extra: Optional[Dict[str, str]] = None) -> Any:
    """`value` (JSON-like) with every string's machine folders written as placeholders; `extra`:
    more {folder: placeholder}."""
    subs = [(re.compile(re.escape(folder) + r"(?![\w.+-])"), name) for folder, name in _placeholders(extra or {})]

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            for pattern, name in subs:
                v = pattern.sub(lambda _m, n=name: n, v)
            return v
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        return v

    return walk(value)
