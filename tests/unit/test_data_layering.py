"""distsplat/data sits below rendering and distribution (docs/design.md, layers): none of its
modules imports distsplat.render, distsplat.distributed or torch.distributed."""

import ast
from pathlib import Path

import distsplat.data

FORBIDDEN = ("distsplat.render", "distsplat.distributed", "torch.distributed", "distsplat.train")


def test_data_imports_nothing_above_it():
    for path in Path(distsplat.data.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [("." * node.level) + node.module]
            for name in names:
                assert not name.startswith(FORBIDDEN), f"{path.name} imports {name}"
                assert not name.startswith(("..render", "..distributed", "..train")), f"{path.name} imports {name}"
