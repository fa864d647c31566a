"""The live viewer's own settings (docs/design.md: a component's settings live in its own
dataclass). `distsplat.app` composes them with the trainer's `Config` into the one command line
(flag names as gsplat's: --disable_viewer, --port), so train/ never sees a viewer flag."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class ViewerConfig:
    disable_viewer: bool = False
    """Do not start the live viewer (viser, on rank 0). It is on by default (not for --eval_only/--render_only)."""
    port: Optional[int] = None
    """Port of the live viewer. None: 8080, or a free port when 8080 is taken (the log says which); an explicit
    port that is in use stops the run before training."""
    viewer_keep_open: bool = False
    """After training, keep serving the final model until Ctrl-C (the checkpoint and PLY are written first). Only
    when rank 0's stdin is a terminal: a non-interactive run (a job script, CI) ends as usual, saying so."""
    viewer_host: str = "127.0.0.1"
    """Address the viewer serves on; 127.0.0.1 keeps it off the network (use ssh -L), 0.0.0.0 exposes it."""
    viewer_res: int = 512
    """Longest side of viewer frames in pixels (the panel changes it)."""
    viewer_budget: float = 0.03
    """Fraction of training wall time that viewer frames may take."""

    def validate(self) -> None:
        """ValueError naming the flag; every rank runs it on the same values."""
        checks = [
            (self.port is None or 0 <= self.port <= 65535, "--port", f"must be in 0..65535, got {self.port}"),
            (0.0 < self.viewer_budget < 1.0, "--viewer_budget", f"must be in (0, 1), got {self.viewer_budget}"),
            (self.viewer_res >= 16, "--viewer_res", f"must be >= 16, got {self.viewer_res}"),
        ]
        for ok, flag, msg in checks:
            if not ok:
                raise ValueError(f"{flag} {msg}")
