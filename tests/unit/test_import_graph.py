"""distsplat's import graph (docs/design.md, layers and "train/ in rooms"), read with ast from
the sources: every import counts, those under `if TYPE_CHECKING:` and inside functions too.

- no import circle anywhere in distsplat/;
- no module but the entry points imports the trainer (train/trainer.py): the checkpointer, the
  evaluation and the model import take what they work on, not the trainer;
- train/'s rooms import downwards only: model/ and guards/ nothing else of train/, files/ only
  model/ and guards/, scoring/ only model/ and files/.
"""

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

import distsplat

ROOT = Path(distsplat.__file__).parent
ENTRY_POINTS = {"distsplat.cli", "distsplat.app"}  # the composition root (docs/design.md, layers)
TRAINER = "distsplat.train.trainer"
ROOMS = {  # room -> the rooms of train/ it may import
    "model": set(),
    "guards": set(),
    "files": {"model", "guards"},
    "scoring": {"model", "files"},
}


def _modules(root: Path) -> Dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(root: Path = ROOT) -> Dict[str, Set[str]]:
    """module -> the distsplat modules it imports (`from pkg import name` counts as the
    module pkg.name where that is a module, else as pkg)."""
    modules = _modules(root)
    graph: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    deps.add(sub if sub in modules else target)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_distsplat():
    assert circles(import_graph()) == []


def test_only_the_entry_points_import_the_trainer():
    importers = sorted(m for m, deps in import_graph().items() if TRAINER in deps)
    assert set(importers) <= ENTRY_POINTS, f"{importers} import {TRAINER}"


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_the_rooms_of_train_import_downwards_only(room):
    prefix = f"distsplat.train.{room}"
    for module, deps in import_graph().items():
        if module != prefix and not module.startswith(prefix + "."):
            continue
        for dep in deps:
            if not dep.startswith("distsplat.train"):
                continue
            parts = dep.split(".")
            dep_room = parts[2] if len(parts) > 2 else None
            assert dep_room == room or dep_room in ROOMS[room], f"{module} imports {dep}"


def test_the_checks_find_what_they_look_for(tmp_path):
    """A circle through a TYPE_CHECKING import and one through a function's import are found."""
    pkg = tmp_path / "distsplat"
    (pkg / "train").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train" / "__init__.py").write_text("")
    (pkg / "train" / "trainer.py").write_text("from .checkpointer import save\n")
    (pkg / "train" / "checkpointer.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .trainer import Trainer\n")
    (pkg / "train" / "evaluate.py").write_text("def f():\n    from . import metrics\n")
    (pkg / "train" / "metrics.py").write_text("from distsplat.train.evaluate import f\n")
    graph = import_graph(pkg)
    assert circles(graph) == [["distsplat.train.checkpointer", "distsplat.train.trainer"],
                              ["distsplat.train.evaluate", "distsplat.train.metrics"]]
    assert TRAINER in graph["distsplat.train.checkpointer"]
