"""The field list of gsplat's `examples/simple_trainer.py` Config, as tests/golden holds it.

gsplat's trainer script is not part of the installed package (its `examples/` folder is only in
the repository) and imports CUDA-only modules, so it is read as source: `ast` finds `class
Config` and records every field's name, annotation and default as written (a
`default_factory=lambda: X` as X; a default whose source is a Python literal also as its value).
Comments and docstrings are not recorded. The strategies' fields come from the installed gsplat
(distsplat pins the version), as dataclasses report them.

    python scripts/gsplat_config_fields.py GSPLAT_CHECKOUT REF OUT.json

e.g. with a checkout of https://github.com/nerfstudio-project/gsplat:

    python scripts/gsplat_config_fields.py ~/gsplat v1.5.3 tests/golden/gsplat_1_5_3_config_fields.json
    python scripts/gsplat_config_fields.py ~/gsplat c3d59bbb tests/golden/gsplat_1_6_0_config_fields.json

tests/unit/test_gsplat_flags.py reads these files: every field must be taken by distsplat's
command line or refused with a reason (distsplat/gsplat_flags.py).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List


def config_fields(source: str) -> List[Dict[str, Any]]:
    """[{name, type, default (source text), value (when the default is a literal)}] of `class
    Config` in the module `source`, in their order."""
    tree = ast.parse(source)
    config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    out = []
    for node in config.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        default = node.value
        if isinstance(default, ast.Call) and getattr(default.func, "id", None) == "field":
            kw = {k.arg: k.value for k in default.keywords}
            factory = kw.get("default_factory")
            default = factory.body if isinstance(factory, ast.Lambda) else (
                ast.Call(func=factory, args=[], keywords=[]) if factory is not None else kw.get("default"))
        entry: Dict[str, Any] = {"name": node.target.id, "type": ast.unparse(node.annotation),
                                 "default": None if default is None else ast.unparse(default)}
        try:
            entry["value"] = _value(default)
        except (ValueError, TypeError, SyntaxError):
            pass
        if isinstance(entry.get("value"), tuple):
            entry["value"] = list(entry["value"])
        out.append(entry)
    return out


def _value(node: ast.AST) -> Any:
    """A literal, or arithmetic on literals (`2.5e-3 / 20`); ValueError for anything else."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a, b = _value(node.left), _value(node.right)
        if not all(isinstance(x, (int, float)) for x in (a, b)):
            raise ValueError("not arithmetic on numbers")
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b, ast.Div: lambda: a / b}
        return ops[type(node.op)]()
    return ast.literal_eval(node)


def strategy_fields() -> Dict[str, List[Dict[str, Any]]]:
    """The installed gsplat's strategies' dataclass fields and defaults."""
    from gsplat.strategy import DefaultStrategy, MCMCStrategy

    return {cls.__name__: [{"name": f.name, "type": str(f.type), "value": f.default}
                           for f in dataclasses.fields(cls)] for cls in (DefaultStrategy, MCMCStrategy)}


def main(checkout: str, ref: str, out: str) -> None:
    import gsplat

    git = ["git", "-C", checkout]
    commit = subprocess.run(git + ["rev-parse", f"{ref}^{{commit}}"], check=True, capture_output=True,
                            text=True).stdout.strip()
    source = subprocess.run(git + ["show", f"{commit}:examples/simple_trainer.py"], check=True,
                            capture_output=True, text=True).stdout
    version_py = subprocess.run(git + ["show", f"{commit}:gsplat/version.py"], check=True, capture_output=True,
                                text=True).stdout
    version = re.search(r"__version__ = \"([^\"]+)\"", version_py)[1]
    data = {
        "source": f"https://github.com/nerfstudio-project/gsplat {ref} ({commit}, version {version}) "
                  "examples/simple_trainer.py, class Config",
        "gsplat_version": version,
        "made_by": "python scripts/gsplat_config_fields.py GSPLAT_CHECKOUT REF OUT.json",
        "config": config_fields(source),
    }
    if gsplat.__version__.split("+")[0] == version:  # the strategies of the installed gsplat are that version's
        data["strategies"] = strategy_fields()
        data["source"] += f"; strategies from the installed gsplat {gsplat.__version__} (gsplat.strategy)"
    Path(out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['config'])} Config fields of gsplat {ref} -> {out}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
