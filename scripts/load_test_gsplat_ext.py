"""Load test of the prebuilt gsplat extension on a machine WITHOUT a GPU.

Run with CPython 3.12 and torch 2.11.0+cu130 importable (importing a CUDA torch needs no
GPU, only its CUDA libraries), gsplat and the repo on PYTHONPATH:

    PYTHONPATH=<site with torch>:<site with gsplat>:$PWD python3.12 scripts/load_test_gsplat_ext.py [--if-needed]

It goes through distsplat.render.gsplat_ext.ensure_gsplat_ops() exactly as on the GPU
machine, with only the GPU's compute capability faked (9.0), then asks gsplat's own
`_wrapper` for every op it calls. The outcome is added as "load_test" to
benchmarks/results/gsplat_compile_sm90.json (keyed by the .so's sha256).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.paths import neutral  # noqa: E402
RESULTS = REPO / "benchmarks" / "results" / "gsplat_compile_sm90.json"


def main() -> int:
    ext_dir = Path(os.environ.get("DISTSPLAT_GSPLAT_EXT", REPO / ".gsplat_ext"))
    os.environ["DISTSPLAT_GSPLAT_EXT"] = str(ext_dir)
    info = json.loads((ext_dir / "build_info.json").read_text())
    old = json.loads(RESULTS.read_text()).get("load_test", {})
    if "--if-needed" in sys.argv and old.get("ok") and old.get("sha256") == info["sha256"]:
        print(f"load test of this .so already recorded ({old['date']}): {old['ensure_gsplat_ops']}")
        return 0
    rec: dict = {"sha256": info["sha256"], "python": sys.version.split()[0],
                 "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                 "command": "PYTHONPATH=... python3.12 scripts/load_test_gsplat_ext.py",
                 "gpu": "none (compute capability faked as 9.0; nothing executed)"}
    try:
        import torch

        rec["torch"] = torch.__version__
        rec["torch_cuda"] = torch.version.cuda
        from distsplat.render import gsplat_ext

        gsplat_ext._device_capability = lambda: (9, 0)
        rec["ensure_gsplat_ops"] = gsplat_ext.ensure_gsplat_ops()
        import gsplat
        from gsplat.cuda import _wrapper
        from gsplat.cuda._backend import _C

        src = Path(_wrapper.__file__).read_text()
        wanted = sorted(set(re.findall(r'_make_lazy_cuda_(?:func|obj)\(\s*"([A-Za-z0-9_]+)', src)))
        names = [n for n in dir(_C) if not n.startswith("_")]
        missing = [w for w in wanted if not hasattr(_C, w)]
        rec.update({
            "gsplat": gsplat.__version__, "module": getattr(_C, "__file__", None),
            "names": names, "ops_wrapper_calls": len(wanted), "missing_ops": missing,
            # gsplat's wrapper resolves an op through the injected module (not called: no GPU).
            "wrapper_resolves": _wrapper._make_lazy_cuda_obj("intersect_tile") is _C.intersect_tile,
        })
        rec["ok"] = not missing and rec["wrapper_resolves"] and rec["ensure_gsplat_ops"].startswith("prebuilt")
    except Exception as e:  # the record says what failed
        rec["ok"] = False
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["traceback"] = traceback.format_exc().splitlines()[-8:]
    result = json.loads(RESULTS.read_text())
    result["load_test"] = neutral(rec)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in rec.items() if k != "names"}, indent=2))
    print(f"{len(rec.get('names', []))} names in the module: {' '.join(rec.get('names', []))}")
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
