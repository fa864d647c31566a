"""Densification strategies: gsplat's `DefaultStrategy` and `MCMCStrategy`, run by every
rank on its own Gaussians (fed by the local means2d gradients of the distributed render).

One repair: gsplat 1.5.3's DefaultStrategy tests `step % self.reset_every == 0 & step > 0`,
which Python parses as the chained comparison `step % reset_every == (0 & step) > 0`, never
true, so opacities are never reset. Our subclass performs the reset the code intends.

One addition: `growth_check(params, n_new) -> bool`, set by the trainer (its memory guard,
memory.py), is asked before each growth with the exact number of Gaussians the growth would
add; False skips that growth only (DefaultStrategy still prunes, MCMCStrategy still
relocates). None (the default) always grows, as gsplat does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, Optional, Tuple

import torch
from gsplat.strategy import DefaultStrategy as GsplatDefaultStrategy
from gsplat.strategy import MCMCStrategy as GsplatMCMCStrategy
from gsplat.strategy.ops import reset_opa

__all__ = ["DefaultStrategy", "MCMCStrategy"]

GrowthCheck = Callable[[Dict[str, torch.Tensor], int], bool]


@dataclass
class DefaultStrategy(GsplatDefaultStrategy):
    """gsplat's DefaultStrategy (clone, split, prune) with the opacity reset every
    `reset_every` steps (until `refine_stop_iter`) restored, and growth behind
    `growth_check`."""

    # Not a dataclass field: not a flag, not in the saved config.
    growth_check: ClassVar[Optional[GrowthCheck]] = None

    def step_post_backward(
        self,
        params: torch.nn.ParameterDict,
        optimizers: Dict[str, torch.optim.Optimizer],
        state: Dict[str, Any],
        step: int,
        info: Dict[str, Any],
        packed: bool = False,
    ) -> None:
        super().step_post_backward(params, optimizers, state, step, info, packed=packed)
        if 0 < step < self.refine_stop_iter and step % self.reset_every == 0:
            reset_opa(params=params, optimizers=optimizers, state=state, value=self.prune_opa * 2.0)

    def growth_candidates(self, params: Dict[str, torch.Tensor], state: Dict[str, Any], step: int) -> int:
        """Gaussians the next `_grow_gs` adds: one per duplicated Gaussian, one per split
        (two replace one), with gsplat's masks (a Gaussian may be both)."""
        grads = state["grad2d"] / state["count"].clamp_min(1)  # [N]
        is_high = grads > self.grow_grad2d
        is_small = torch.exp(params["scales"]).max(dim=-1).values <= self.grow_scale3d * state["scene_scale"]
        is_split = is_high & ~is_small
        if step < self.refine_scale2d_stop_iter:
            is_split |= state["radii"] > self.grow_scale2d
        return int(((is_high & is_small).sum() + is_split.sum()).item())  # one host sync, refine steps only

    @torch.no_grad()
    def _grow_gs(self, params, optimizers, state, step) -> Tuple[int, int]:
        if self.growth_check is not None and not self.growth_check(params, self.growth_candidates(params, state, step)):
            return 0, 0
        return super()._grow_gs(params, optimizers, state, step)


@dataclass
class MCMCStrategy(GsplatMCMCStrategy):
    """gsplat's MCMCStrategy (relocate, add up to `cap_max`, noise), with adding behind
    `growth_check`."""

    growth_check: ClassVar[Optional[GrowthCheck]] = None

    @torch.no_grad()
    def _add_new_gs(self, params, optimizers, binoms) -> int:
        if self.growth_check is not None:
            n = len(params["means"])
            n_new = max(0, min(self.cap_max, int(1.05 * n)) - n)  # gsplat's rule
            if not self.growth_check(params, n_new):
                return 0
        return super()._add_new_gs(params, optimizers, binoms)
