"""Check 1 of scripts/gpu_validate.sh: what every later check needs, failing fast with the reason.

Run on the GPU machine after the carried wheels are installed (gpu_validate.sh does it):

    python3 scripts/gpu_setup_check.py MACHINE_JSON

1. A CUDA GPU is visible to torch.
2. fused-ssim imports and runs (the training loss's --ssim_impl fused, gsplat's trainer's SSIM):
   a run that silently fell back to the PyTorch SSIM would time something else.
3. gsplat's CUDA ops come from the carried prebuilt extension (DISTSPLAT_GSPLAT_EXT, made by
   scripts/build_gsplat_ext.sh): its build_info.json must match this torch, Python and GPU, and
   distsplat's loader must take it. gsplat's JIT build is NOT a fallback here: it would spend
   minutes of the call compiling (distsplat.render.gsplat_ext falls back to it silently but for
   one WARNING), so the fallback is replaced by an error naming why the prebuilt one was refused.

Prints one line per item ("setup: ok ..." or "setup: FAIL ..."), writes the machine's
description (benchmarks.common.machine(), the versions, what was loaded) to MACHINE_JSON for the
run records, and exits non-zero at the first failure.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def fail(what: str, why: str) -> None:
    print(f"setup: FAIL {what}: {why}", flush=True)
    sys.exit(1)


def main() -> int:
    t0 = time.perf_counter()
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    import torch

    if not torch.cuda.is_available():
        fail("GPU", f"torch {torch.__version__} sees no CUDA device (torch.version.cuda={torch.version.cuda})")
    name = torch.cuda.get_device_name(0)
    print(f"setup: ok GPU {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"Python {sys.version.split()[0]}", flush=True)

    # 2. fused-ssim: importable, taken by the trainer's resolution, and its kernel runs here
    try:
        import fused_ssim
    except Exception as e:  # ImportError, or an OSError from its .so
        fail("fused-ssim", f"import failed ({type(e).__name__}: {e}); carry .gsplat_peer (its site/ holds the "
                           "sm_90 build, scripts/prepare_gsplat_peer.sh)")
    from distsplat.train.scoring.losses import resolve_ssim_impl

    try:
        impl = resolve_ssim_impl("fused", torch.device("cuda", 0))
    except ValueError as e:
        fail("fused-ssim", str(e))
    try:
        a = torch.rand(1, 3, 32, 32, device="cuda")
        v = float(fused_ssim.fused_ssim(a, a.clone()))
    except Exception as e:
        fail("fused-ssim", f"its kernel did not run on this GPU ({type(e).__name__}: {e})")
    if abs(v - 1.0) > 1e-3:
        fail("fused-ssim", f"SSIM of an image with itself is {v}, not 1")
    print(f"setup: ok fused-ssim {fused_ssim.__file__} (--ssim_impl fused resolves to {impl})", flush=True)

    # 3. gsplat's ops from the prebuilt extension, never by JIT
    from distsplat.render import gsplat_ext

    folder = os.environ.get(gsplat_ext.ENV_VAR)
    if not folder:
        fail("gsplat ops", f"{gsplat_ext.ENV_VAR} is not set (gpu_validate.sh sets it to the carried .gsplat_ext)")
    so, why = gsplat_ext.check_build_info(Path(folder))
    if so is None:
        fail("gsplat ops", f"the prebuilt extension in {folder} cannot be used: {why}. Carry .gsplat_ext made by "
                           "scripts/build_gsplat_ext.sh (gpu_prepare.sh) for torch 2.11.0+cu130, Python 3.12, sm_90")

    def no_jit():
        raise RuntimeError("gsplat's JIT build is not allowed in this call (it would spend minutes compiling)")

    gsplat_ext._jit_backend = no_jit  # distsplat's fallback, refused here: the WARNING above it says why
    try:
        how = gsplat_ext.ensure_gsplat_ops()
    except RuntimeError as e:
        fail("gsplat ops", str(e))
    if not how.startswith("prebuilt"):
        fail("gsplat ops", f"obtained as {how!r}, not from the prebuilt extension")
    import gsplat
    import gsplat.cuda._backend as backend

    ops = [n for n in dir(backend._C) if not n.startswith("_")]
    print(f"setup: ok gsplat {gsplat.__version__} ops {how} ({len(ops)} ops)", flush=True)

    if out is not None:
        from benchmarks.common import machine

        info = {"machine": machine(), "gpu": name, "torch": torch.__version__, "cuda": torch.version.cuda,
                "gsplat": gsplat.__version__, "gsplat_ops": how, "fused_ssim": fused_ssim.__file__,
                "commit": os.environ.get("DISTSPLAT_COMMIT")}
        out.write_text(json.dumps(info, indent=2) + "\n")
    print(f"setup: ok in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
