"""What an extension sees of a running training (the live viewer: a layer above train/, wired
in by distsplat.app), on every rank: the flags, the scene and its training cameras, this rank's
Gaussians and the appearance model they render with, the run's metrics and Gaussian count, and
the hooks it may add. Read-only, and live: the dicts are the trainer's own (updated in place),
the count is read when asked. The trainer's other state stays its own."""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import numpy as np
import torch


class RunView:
    def __init__(self, cfg: Any, scene: Any, train_np: np.ndarray, params: torch.nn.ParameterDict, app: Any,
                 metrics: Dict[str, Any], n_all: Callable[[], int], step_hooks: List[Callable[..., None]],
                 end_hooks: List[Callable[..., None]]):
        self.cfg, self.scene, self.train_np = cfg, scene, train_np  # train_np: [C_train] scene indices
        self.params, self.app, self.metrics = params, app, metrics  # app: --app_opt's model or None
        self._n_all = n_all
        # hook(view, step) on EVERY rank after each step; hook(view) once training ended, saved and
        # evaluated. Hooks that run collectives must run them on every rank in the same order.
        self.step_hooks, self.end_hooks = step_hooks, end_hooks

    @property
    def n_all(self) -> int:
        """The Gaussians of all ranks, as of the last count."""
        return self._n_all()
