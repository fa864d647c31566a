"""The application entry point: the trainer's CLI with the live viewer attached.

The composition root: the only module that imports both `distsplat.train` and the layer
above it, `distsplat.viewer`, so that train never imports the viewer (docs/design.md layers).
It composes the command line from the trainer's `Config` and the viewer's `ViewerConfig`
(one flat set of flags, gsplat's names) and attaches the viewer to the run.
`examples/simple_trainer.py` and the `distsplat-train` console script call `main`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

from .cli import CONFIGS as TRAIN_CONFIGS
from .cli import main as train_main
from .train.config import Config
from .viewer import attach_live_viewer
from .viewer.config import ViewerConfig


@dataclass
class AppConfig(ViewerConfig, Config):
    """The trainer's flags, then the viewer's (cfg.yml holds both)."""

    def validate(self) -> None:
        Config.validate(self)
        ViewerConfig.validate(self)

    @classmethod
    def of(cls, cfg: Config, **viewer) -> "AppConfig":
        """cfg's values (shared, not copied: the strategy object is cfg's) with the viewer's defaults, or `viewer`."""
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(Config)}, **viewer)


CONFIGS = {name: (doc, AppConfig.of(cfg)) for name, (doc, cfg) in TRAIN_CONFIGS.items()}


def main(args: Optional[Sequence[str]] = None) -> None:
    train_main(args, extensions=[attach_live_viewer], configs=CONFIGS)


if __name__ == "__main__":
    main()
