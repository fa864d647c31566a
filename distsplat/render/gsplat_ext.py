"""How backend `gsplat` gets gsplat's compiled CUDA ops (`gsplat.cuda._backend._C`).

gsplat 1.5.3 builds its extension by JIT when `gsplat.cuda._backend` is first imported:
minutes of nvcc, a race when several ranks import at once, and a silent `_C = None` when
no CUDA toolkit is found. `ensure_gsplat_ops()` avoids all three:

1. If env `DISTSPLAT_GSPLAT_EXT` names a folder made by scripts/build_gsplat_ext.sh whose
   build_info.json matches the running torch, Python and GPU, the prebuilt module is loaded
   and installed as `sys.modules["gsplat.cuda._backend"]` (a module whose `_C` is it) BEFORE
   gsplat's own `_backend` runs; gsplat's `_wrapper` imports `_C` from there lazily, per call.
2. Otherwise (no env, mismatch, load failure: one WARNING says why) gsplat's JIT runs once,
   in this process. `python -m distsplat.render.gsplat_ext` does this before torchrun so
   ranks find the build cached instead of compiling concurrently.
3. If `_C` is still None, a RuntimeError says why and what to do.

Only the render layer uses this; it imports nothing from distributed/ or train/. gsplat's
`_backend` module itself is touched only through gsplat_compat (the seam of gsplat's internals).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any, Optional, Tuple

from ..gsplat_compat import BACKEND_MODULE, backend_ops, install_backend, loaded_backend  # noqa: F401 (tests read BACKEND_MODULE here)

log = logging.getLogger(__name__)

ENV_VAR = "DISTSPLAT_GSPLAT_EXT"
EXT_NAME = "gsplat_cuda"  # the PYBIND11_MODULE name gsplat's ext.cpp gets (TORCH_EXTENSION_NAME)
BUILD_SCRIPT = "scripts/build_gsplat_ext.sh"

_lock = threading.Lock()
_result: Optional[str] = None  # how the ops were obtained, once they were


def python_tag() -> str:
    """The running interpreter's extension tag, e.g. 'cpython-312-x86_64-linux-gnu'."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]  # '.cpython-312-x86_64-linux-gnu.so'
    return suffix[1:-3] if suffix.endswith(".so") else suffix.lstrip(".")


def _device_capability() -> Optional[Tuple[int, int]]:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def check_build_info(folder: Path) -> Tuple[Optional[Path], str]:
    """(path of the .so, "") when `folder` holds a build for this process, else (None, why)."""
    info_path = folder / "build_info.json"
    if not info_path.is_file():
        return None, f"{info_path} not found (make it with {BUILD_SCRIPT})"
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError) as e:
        return None, f"{info_path} is not readable JSON ({e})"
    import torch

    want = {"torch_version": torch.__version__, "torch_cuda": torch.version.cuda, "python_tag": python_tag()}
    for key, have in want.items():
        if info.get(key) != have:
            return None, f"{info_path} was built for {key}={info.get(key)!r}, this process has {have!r}"
    cap = _device_capability()
    if cap is None:
        return None, "no CUDA device is visible (torch.cuda.is_available() is False)"
    # A cubin for sm_XY runs on devices X.Z with Z >= Y (same major): Hopper sm_90 on 9.0.
    archs = [tuple(int(p) for p in str(a).split(".")) for a in info.get("arch_list", [])]
    if not any(a[0] == cap[0] and a[1] <= cap[1] for a in archs):
        return None, (f"{info_path} holds code for compute capability {info.get('arch_list')}, "
                      f"this GPU is {cap[0]}.{cap[1]}")
    so = folder / str(info.get("file", ""))
    if not so.is_file():
        return None, f"{so} (named by {info_path}) not found"
    sha = hashlib.sha256(so.read_bytes()).hexdigest()
    if info.get("sha256") and sha != info["sha256"]:
        return None, f"{so} does not match the sha256 in {info_path} (truncated or replaced copy?)"
    return so, ""


def _load_extension(path: Path) -> Any:
    """Loads the prebuilt module. torch is imported first: its libraries (libtorch*,
    libc10*, libcudart) are then loaded, and the module's NEEDED entries resolve to them by
    soname, as torch's own extensions do."""
    import torch  # noqa: F401  (loads the libraries the extension needs)

    loader = importlib.machinery.ExtensionFileLoader(EXT_NAME, str(path))
    spec = importlib.util.spec_from_file_location(EXT_NAME, str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _install_backend(ext: Any, path: Path) -> None:
    install_backend(ext, str(path), f"gsplat's CUDA ops, prebuilt by {BUILD_SCRIPT} ({path})")


def _jit_backend() -> Any:
    """gsplat's own route: import _backend, which JIT-builds (or finds the cached build)."""
    return backend_ops()


def _why_no_toolkit() -> str:
    import torch

    if torch.version.cuda is None:
        return (f"this torch ({torch.__version__}) is a CPU-only build (torch.version.cuda is None); "
                "gsplat's CUDA ops need a CUDA build of torch")
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = shutil.which("nvcc") or (home and shutil.which("nvcc", path=os.path.join(home, "bin")))
    if not nvcc:
        return (f"no CUDA toolkit was found (no nvcc on PATH, CUDA_HOME={home!r}); gsplat's JIT build "
                f"needs CUDA {torch.version.cuda}, the version torch.version.cuda names")
    return f"a CUDA toolkit was found ({nvcc}) but gsplat's JIT build left no module"


def _fail(why: str) -> RuntimeError:
    import torch

    if torch.version.cuda is None:
        fix = ("install a CUDA build of torch (use backend 'torch' on CPU), then a CUDA toolkit "
               "matching its torch.version.cuda")
    else:
        fix = (f"install a CUDA toolkit matching torch.version.cuda ({torch.version.cuda}) with nvcc "
               "on PATH or CUDA_HOME set, so gsplat can build it")
    return RuntimeError(
        f"gsplat's CUDA extension could not be built or loaded: {why}. Fix: {fix}, or set {ENV_VAR} "
        f"to a folder made by {BUILD_SCRIPT} for this torch ({torch.__version__}), Python "
        f"({python_tag()}) and GPU."
    )


def _obtain() -> str:
    existing = loaded_backend()
    if existing is not None and getattr(existing, "_C", None) is not None:
        return "already loaded"
    folder = os.environ.get(ENV_VAR)
    if folder:
        so, why = check_build_info(Path(folder))
        if so is not None:
            try:
                ext = _load_extension(so)
            except Exception as e:  # an ImportError/OSError from dlopen, or PyInit failing
                why = f"loading {so} failed: {type(e).__name__}: {e}"
            else:
                _install_backend(ext, so)
                return f"prebuilt {so}"
        log.warning("%s=%s not used: %s; falling back to gsplat's JIT build", ENV_VAR, folder, why)
    import torch

    if torch.version.cuda is None:
        # gsplat's JIT would still start nvcc (when one is installed) against CPU headers.
        raise _fail(_why_no_toolkit())
    try:
        ext = _jit_backend()
    except Exception as e:
        raise _fail(f"gsplat's JIT build raised {type(e).__name__}: {e}") from e
    if ext is None:
        raise _fail(_why_no_toolkit())
    return "jit"


def ensure_gsplat_ops() -> str:
    """Makes gsplat's CUDA ops available in this process and says how: "prebuilt <path>",
    "jit" or "already loaded". Idempotent; after the first success it only returns."""
    global _result
    if _result is not None:
        return _result
    with _lock:
        if _result is None:
            _result = _obtain()
    return _result


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        how = ensure_gsplat_ops()
    except RuntimeError as e:
        print(f"gsplat_ext: {e}", file=sys.stderr)
        return 1
    ops = [n for n in dir(backend_ops()) if not n.startswith("_")]
    print(f"gsplat_ext: gsplat CUDA ops {how} ({len(ops)} names in {EXT_NAME})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
