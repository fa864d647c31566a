"""Files written whole or not at all: JSON and gsplat's cfg.yml, through a temporary file
and a rename (a kill leaves the old file or the new one, never half of one)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict


def write_json(path: Path, data: Dict[str, Any]) -> None:
    """Atomic: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def write_yaml(path: Path, data: Dict[str, Any]) -> None:
    """Atomic YAML of a config dict (nested dicts, lists of scalars, scalars), as gsplat's
    cfg.yml, without a YAML dependency: block mappings, flow lists, JSON-quoted strings and
    floats that YAML 1.1 readers (PyYAML) read back as floats."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(_yaml_lines(data, 0)))
    os.replace(tmp, path)


def _yaml_lines(data: Dict[str, Any], indent: int):
    for key, value in data.items():
        pad = " " * indent
        if isinstance(value, dict):
            yield f"{pad}{key}:{'' if value else ' {}'}\n"
            yield from _yaml_lines(value, indent + 2)
        elif isinstance(value, (list, tuple)):
            yield f"{pad}{key}: [{', '.join(_yaml_scalar(v) for v in value)}]\n"
        else:
            yield f"{pad}{key}: {_yaml_scalar(value)}\n"


def _yaml_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return ".nan"
        if v in (float("inf"), float("-inf")):
            return ".inf" if v > 0 else "-.inf"
        text = repr(v)
        mantissa, e, exponent = text.partition("e")
        if e and "." not in mantissa:  # YAML 1.1 reads 1e-05 as a string, 1.0e-05 as a float
            text = f"{mantissa}.0e{exponent}"
        return text
    return json.dumps(str(v))  # a double-quoted YAML scalar
