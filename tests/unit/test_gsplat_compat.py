"""gsplat's internals behind one seam (distsplat/gsplat_compat.py, issue 31 point 6): the
supported versions are pyproject's pin, another version fails at import naming both, and no
other module of distsplat reaches into gsplat's private names."""

import ast
import importlib.util
import re
from pathlib import Path

import gsplat
import pytest

import distsplat
from distsplat import gsplat_compat

ROOT = Path(distsplat.__file__).parent


def test_supported_versions_are_pyprojects_pin():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    Requirement = pytest.importorskip("packaging.requirements").Requirement
    deps = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "gsplat"]
    pinned = sorted(s.version for s in req.specifier if s.operator == "==")
    assert pinned and len(pinned) == len(req.specifier), f"pin gsplat to exact versions: {req}"
    assert pinned == sorted(gsplat_compat.SUPPORTED_GSPLAT)
    assert gsplat.__version__.split("+")[0] in gsplat_compat.SUPPORTED_GSPLAT


def test_check_gsplat_version():
    for v in gsplat_compat.SUPPORTED_GSPLAT:
        gsplat_compat.check_gsplat_version(v)
        gsplat_compat.check_gsplat_version(v + "+pt24cu124")  # a prebuilt wheel's local tag
    with pytest.raises(ImportError) as e:
        gsplat_compat.check_gsplat_version("1.6.0")
    msg = str(e.value)
    assert "1.6.0" in msg and all(v in msg for v in gsplat_compat.SUPPORTED_GSPLAT)


def test_import_with_an_unsupported_gsplat_fails(monkeypatch):
    # A fresh copy of the module, so that the imported one (and the classes built on it) stay.
    monkeypatch.setattr(gsplat, "__version__", "1.6.0")
    spec = importlib.util.spec_from_file_location("gsplat_compat_copy", ROOT / "gsplat_compat.py")
    with pytest.raises(ImportError, match=r"gsplat 1\.5\.3.*gsplat 1\.6\.0 is installed"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


GSPLAT_PRIVATE_STEPS = {"_update_state", "_grow_gs", "_prune_gs", "_relocate_gs", "_add_new_gs"}


def test_only_the_seam_uses_gsplat_internals():
    private = re.compile(r"(^|\.)_[a-z]")  # a module or name with a leading underscore
    for path in ROOT.rglob("*.py"):
        if path.name == "gsplat_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                assert node.name not in GSPLAT_PRIVATE_STEPS, \
                    f"{path.relative_to(ROOT)} overrides gsplat's {node.name}: override gsplat_compat's hook"
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gsplat"):
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("gsplat")]
            else:
                continue
            for name in names:
                assert not private.search(name), f"{path.relative_to(ROOT)} imports {name}: use distsplat.gsplat_compat"
