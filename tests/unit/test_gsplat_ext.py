"""distsplat.render.gsplat_ext chooses between a prebuilt gsplat extension and gsplat's JIT
build. On CPU the loader, the JIT and the GPU's compute capability are replaced by fakes;
gsplat's real `_wrapper` is then asked for `_C` to prove the injection reaches it."""

import hashlib
import json
import logging
import sys
import types

import pytest
import torch

from distsplat.render import gsplat_ext

CUDA = "13.0"  # the build_info below claims a CUDA torch; torch.version.cuda is patched to match


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A clean state: no gsplat backend imported, no cached result, a GPU of capability 9.0,
    a CUDA torch, and a JIT that records its calls instead of compiling."""
    import gsplat.cuda

    # Saved and restored by hand: a test may install the module where none was before.
    saved_module = sys.modules.pop(gsplat_ext.BACKEND_MODULE, None)
    saved_attr = gsplat.cuda.__dict__.pop("_backend", None)
    monkeypatch.setattr(gsplat_ext, "_result", None)
    monkeypatch.setattr(gsplat_ext, "_device_capability", lambda: (9, 0))
    monkeypatch.setattr(torch.version, "cuda", CUDA)
    calls = {"jit": 0, "load": []}
    jit_module = types.SimpleNamespace(name="jit-built")

    def fake_jit():
        calls["jit"] += 1
        return jit_module

    monkeypatch.setattr(gsplat_ext, "_jit_backend", fake_jit)
    monkeypatch.delenv(gsplat_ext.ENV_VAR, raising=False)
    yield types.SimpleNamespace(calls=calls, jit_module=jit_module, dir=tmp_path, mp=monkeypatch)
    monkeypatch.undo()  # first, so the restoring below is not undone by it
    sys.modules.pop(gsplat_ext.BACKEND_MODULE, None)
    gsplat.cuda.__dict__.pop("_backend", None)
    if saved_module is not None:
        sys.modules[gsplat_ext.BACKEND_MODULE] = saved_module
    if saved_attr is not None:
        gsplat.cuda._backend = saved_attr


def write_build(folder, **overrides):
    so = folder / f"{gsplat_ext.EXT_NAME}.{gsplat_ext.python_tag()}.so"
    so.write_bytes(b"not really an ELF file")
    info = {
        "file": so.name,
        "sha256": hashlib.sha256(so.read_bytes()).hexdigest(),
        "torch_version": torch.__version__,
        "torch_cuda": CUDA,
        "python_tag": gsplat_ext.python_tag(),
        "arch_list": ["9.0"],
    }
    info.update(overrides)
    (folder / "build_info.json").write_text(json.dumps(info))
    return so


def fake_ext():
    ext = types.ModuleType(gsplat_ext.EXT_NAME)
    ext.some_op = lambda *a: ("some_op", a)
    ext.ShutterType = types.SimpleNamespace(GLOBAL=4)
    return ext


def fall_back(env, caplog, folder):
    """Points DISTSPLAT_GSPLAT_EXT at `folder` and asks for gsplat's ops: the JIT must be
    chosen. Returns the log records (the warning that says why)."""
    env.mp.setenv(gsplat_ext.ENV_VAR, str(folder))
    with caplog.at_level(logging.WARNING, logger=gsplat_ext.__name__):
        assert gsplat_ext.ensure_gsplat_ops() == "jit"
    return caplog.records


def test_no_env_uses_jit_without_warning(env, caplog):
    with caplog.at_level(logging.WARNING, logger=gsplat_ext.__name__):
        assert gsplat_ext.ensure_gsplat_ops() == "jit"
    assert env.calls["jit"] == 1
    assert caplog.records == []


@pytest.mark.parametrize(
    "overrides, reason",
    [
        (dict(torch_version="2.0.0+cu118"), "torch_version='2.0.0+cu118'"),
        (dict(torch_cuda="12.4"), "torch_cuda='12.4'"),
        (dict(python_tag="cpython-39-x86_64-linux-gnu"), "python_tag='cpython-39-x86_64-linux-gnu'"),
        (dict(arch_list=["8.0", "8.6"]), "compute capability ['8.0', '8.6'], this GPU is 9.0"),
        (dict(sha256="0" * 64), "does not match the sha256"),
        (dict(file="elsewhere.so"), "elsewhere.so (named by"),
    ],
)
def test_mismatched_build_falls_back_to_jit_with_a_warning(env, caplog, overrides, reason):
    write_build(env.dir, **overrides)
    env.mp.setattr(gsplat_ext, "_load_extension", lambda p: env.calls["load"].append(p))
    [record] = fall_back(env, caplog, env.dir)
    assert env.calls == {"jit": 1, "load": []}
    assert record.levelno == logging.WARNING
    assert reason in record.getMessage() and "falling back to gsplat's JIT build" in record.getMessage()


def test_missing_build_info_falls_back(env, caplog):
    [record] = fall_back(env, caplog, env.dir / "nope")
    assert "build_info.json not found" in record.getMessage()
    assert gsplat_ext.BUILD_SCRIPT in record.getMessage()


def test_no_gpu_falls_back(env, caplog):
    write_build(env.dir)
    env.mp.setattr(gsplat_ext, "_device_capability", lambda: None)
    assert "no CUDA device is visible" in fall_back(env, caplog, env.dir)[0].getMessage()


def test_load_failure_falls_back(env, caplog):
    so = write_build(env.dir)

    def broken(path):
        raise ImportError("libc10_cuda.so: cannot open shared object file")

    env.mp.setattr(gsplat_ext, "_load_extension", broken)
    msg = fall_back(env, caplog, env.dir)[0].getMessage()
    assert f"loading {so} failed: ImportError: libc10_cuda.so" in msg
    assert gsplat_ext.BACKEND_MODULE not in sys.modules


def test_real_loader_rejects_a_file_that_is_no_extension(env, caplog):
    """The real ExtensionFileLoader path: a bad file is a load failure, not a crash."""
    write_build(env.dir)
    assert "failed: ImportError" in fall_back(env, caplog, env.dir)[0].getMessage()


def test_good_build_is_injected_and_gsplat_wrapper_resolves_it(env, caplog):
    so = write_build(env.dir)
    env.mp.setenv(gsplat_ext.ENV_VAR, str(env.dir))
    ext = fake_ext()

    def loader(path):
        env.calls["load"].append(path)
        return ext

    env.mp.setattr(gsplat_ext, "_load_extension", loader)
    with caplog.at_level(logging.WARNING, logger=gsplat_ext.__name__):
        assert gsplat_ext.ensure_gsplat_ops() == f"prebuilt {so}"
    assert caplog.records == []
    assert env.calls == {"jit": 0, "load": [so]}
    # gsplat's own code, unchanged, now finds the prebuilt module.
    from gsplat.cuda import _wrapper
    from gsplat.cuda._backend import _C

    assert _C is ext
    assert _wrapper._make_lazy_cuda_func("some_op")(1, 2) == ("some_op", (1, 2))
    assert _wrapper._make_lazy_cuda_obj("ShutterType") is ext.ShutterType
    # Idempotent: a second call neither loads nor builds again.
    assert gsplat_ext.ensure_gsplat_ops() == f"prebuilt {so}"
    assert env.calls == {"jit": 0, "load": [so]}


def test_backend_already_loaded(env):
    backend = types.ModuleType(gsplat_ext.BACKEND_MODULE)
    backend._C = fake_ext()
    env.mp.setitem(sys.modules, gsplat_ext.BACKEND_MODULE, backend)
    assert gsplat_ext.ensure_gsplat_ops() == "already loaded"
    assert env.calls["jit"] == 0


def test_backend_imported_without_ops_gets_the_prebuilt_one(env):
    """gsplat's _backend already ran and set `_C = None` (no toolkit): the prebuilt module
    replaces `_C` there, which gsplat's wrapper reads per call."""
    backend = types.ModuleType(gsplat_ext.BACKEND_MODULE)
    backend._C = None
    env.mp.setitem(sys.modules, gsplat_ext.BACKEND_MODULE, backend)
    so = write_build(env.dir)
    env.mp.setenv(gsplat_ext.ENV_VAR, str(env.dir))
    ext = fake_ext()
    env.mp.setattr(gsplat_ext, "_load_extension", lambda p: ext)
    assert gsplat_ext.ensure_gsplat_ops() == f"prebuilt {so}"
    assert backend._C is ext


def test_no_ops_raise_a_runtime_error_that_says_what_to_do(env):
    env.mp.setattr(gsplat_ext, "_jit_backend", lambda: None)
    env.mp.setattr(gsplat_ext.shutil, "which", lambda *a, **k: None)
    env.mp.delenv("CUDA_HOME", raising=False)
    env.mp.delenv("CUDA_PATH", raising=False)
    with pytest.raises(RuntimeError) as err:
        gsplat_ext.ensure_gsplat_ops()
    msg = str(err.value)
    assert msg.startswith("gsplat's CUDA extension could not be built or loaded: no CUDA toolkit was found")
    assert "no nvcc on PATH" in msg and f"needs CUDA {CUDA}" in msg
    assert "install a CUDA toolkit matching torch.version.cuda (13.0)" in msg
    assert f"set {gsplat_ext.ENV_VAR} to a folder made by {gsplat_ext.BUILD_SCRIPT}" in msg
    # Not cached: a later call (after installing a toolkit) tries again.
    assert gsplat_ext._result is None


def test_cpu_only_torch_is_named_as_the_reason_without_trying_the_jit(env):
    env.mp.setattr(torch.version, "cuda", None)
    with pytest.raises(RuntimeError, match=r"is a CPU-only build \(torch.version.cuda is None\)"):
        gsplat_ext.ensure_gsplat_ops()
    assert env.calls["jit"] == 0
    with pytest.raises(RuntimeError, match=r"Fix: install a CUDA build of torch"):
        gsplat_ext.ensure_gsplat_ops()


def test_jit_exception_becomes_the_runtime_error(env):
    def boom():
        raise OSError("nvcc fatal: Unsupported gpu architecture")

    env.mp.setattr(gsplat_ext, "_jit_backend", boom)
    with pytest.raises(RuntimeError, match=r"JIT build raised OSError: nvcc fatal"):
        gsplat_ext.ensure_gsplat_ops()


def test_python_tag_matches_this_interpreter():
    v = sys.version_info
    assert gsplat_ext.python_tag().startswith(f"cpython-{v.major}{v.minor}")
