"""The application entry point: the trainer's CLI with the live viewer attached.

The composition root: the only module that imports both `distsplat.train` and the layer
above it, `distsplat.viewer`, so that train never imports the viewer (docs/design.md layers).
`examples/simple_trainer.py` and the `distsplat-train` console script call `main`.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .cli import main as train_main
from .viewer import attach_live_viewer


def main(args: Optional[Sequence[str]] = None) -> None:
    train_main(args, extensions=[attach_live_viewer])


if __name__ == "__main__":
    main()
