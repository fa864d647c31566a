"""Densification strategies: gsplat's `DefaultStrategy` and `MCMCStrategy`, run by every
rank on its own Gaussians (fed by the local means2d gradients of the distributed render).
gsplat's private steps are reached only through gsplat_compat's bases, whose hooks
(`update_state`, `grow`, `add_new`) the strategies below override.

One repair: gsplat 1.5.3's DefaultStrategy tests `step % self.reset_every == 0 & step > 0`,
which Python parses as the chained comparison `step % reset_every == (0 & step) > 0`, never
true, so opacities are never reset. Our subclass performs the reset the code intends.

One addition: `growth_check(params, n_new) -> bool`, set by the trainer (its memory guard,
memory.py), is asked before each growth with the exact number of Gaussians the growth would
add; False skips that growth only (DefaultStrategy still prunes, MCMCStrategy still
relocates). None (the default) always grows, as gsplat does.

And persistent Gaussian ids (gaussians.py), so that densification is W-invariant: the state
carries "uid" [N] int64 (one id per Gaussian, with its chunk) and "seed". Duplicate and
split give their newborns ids derived from (parent id, step, child index), and the split
draws its offsets from normal_samples(seed, step, id): the same Gaussians grow the same
children on any W, in any order (gsplat's split draws from the rank's torch RNG, whose
stream depends on which rank holds which Gaussians). Prune, duplicate and split carry the
ids like any per-Gaussian state. MCMC stays per rank by design (its multinomial draws come
from the rank's RNG); it only keeps the ids unique: a relocated Gaussian gets an id derived
from its slot's old one, an added one from the id of the row at its position j < N. A
state without "uid" (a strategy used on its own) numbers its Gaussians 0..N-1 first.

And the step's `good` flag (faults.py's divergence check: [] 1.0, or 0.0 when the loss or
gradients of the step are NaN/Inf on any rank; on the device, never read on the host):
`step_post_backward(..., good=)` adds nothing to DefaultStrategy's grad2d/count/radii on a
bad step, and injects no MCMC position noise (its lr scaled by the flag). Everything else
runs as on a good step: a refinement (grow, prune; relocate, add) or an opacity reset that
falls on a bad step runs from the statistics of the good steps before it (before the
check moved onto the device, a bad step skipped them). good=None: gsplat's step as is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, Optional, Tuple

import torch
from torch import Tensor
from gsplat.strategy import DefaultStrategy as GsplatDefaultStrategy
from gsplat.strategy.ops import reset_opa

from ...gsplat_compat import DefaultStrategyBase, MCMCStrategyBase
from .gaussians import ADDED, RELOCATED, derive_ids
from .strategy_ops import duplicate_with_ids, ids_of, split_with_ids

__all__ = ["DefaultStrategy", "MCMCStrategy", "reset_opacities_if_due"]

GrowthCheck = Callable[[Dict[str, torch.Tensor], int], bool]


def reset_opacities_if_due(strategy: GsplatDefaultStrategy, params, optimizers, state: Dict[str, Any],
                           step: int) -> None:
    """The opacity reset gsplat's DefaultStrategy intends (module doc): every `reset_every`
    steps before `refine_stop_iter`, opacities are clamped to 2 * prune_opa by gsplat's
    reset_opa (which also zeroes their Adam moments). Also what benchmarks/gsplat_peer.py's
    PEER_RESET=1 adds to gsplat's own trainer."""
    if 0 < step < strategy.refine_stop_iter and step % strategy.reset_every == 0:
        reset_opa(params=params, optimizers=optimizers, state=state, value=strategy.prune_opa * 2.0)


@dataclass
class DefaultStrategy(DefaultStrategyBase):
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
        good: Optional[Tensor] = None,
    ) -> None:
        """gsplat's step (statistics, then grow and prune at refine steps), the opacity
        reset; `good` ([] 1.0 or 0.0 on the device, None: 1) weighs this step's statistics."""
        self._good = good
        try:
            super().step_post_backward(params, optimizers, state, step, info, packed=packed)
        finally:
            self._good = None
        reset_opacities_if_due(self, params, optimizers, state, step)

    # This step's weight while step_post_backward runs (not a field: not a flag, not saved).
    _good: ClassVar[Optional[Tensor]] = None

    def update_state(self, params, state: Dict[str, Any], info: Dict[str, Any], packed: bool = False) -> None:
        """gsplat 1.5.3's running statistics (the screen-space gradient norm summed into
        grad2d [N], the views counted in count [N], the largest normalised radius in radii
        [N]), with the step's weight `_good`: a good step (1.0) adds exactly what gsplat
        adds, a bad one (0.0) nothing, NaN gradients included (masked with where, not
        multiplied). Without a weight: gsplat's own method."""
        good = self._good
        if good is None:
            return super().update_state(params, state, info, packed=packed)
        for key in ("width", "height", "n_cameras", "radii", "gaussian_ids", self.key_for_gradient):
            assert key in info, f"{key} is required but missing."
        means2d = info[self.key_for_gradient]
        grads = (means2d.absgrad if self.absgrad else means2d.grad).clone()
        grads[..., 0] *= info["width"] / 2.0 * info["n_cameras"]  # to [-1, 1] screen space
        grads[..., 1] *= info["height"] / 2.0 * info["n_cameras"]
        n = len(list(params.values())[0])
        for key in ("grad2d", "count") + (("radii",) if self.refine_scale2d_stop_iter > 0 else ()):
            if state[key] is None:
                state[key] = torch.zeros(n, device=grads.device)
        if packed:
            gs_ids = info["gaussian_ids"]  # [nnz]
            radii = info["radii"].max(dim=-1).values  # [nnz]
        else:  # grads [C, N, 2]
            sel = (info["radii"] > 0.0).all(dim=-1)  # [C, N]
            gs_ids = torch.where(sel)[1]  # [nnz]
            grads = grads[sel]  # [nnz, 2]
            radii = info["radii"][sel].max(dim=-1).values  # [nnz]
        ok = good > 0  # []
        state["grad2d"].index_add_(0, gs_ids, torch.where(ok, grads.norm(dim=-1), 0.0))
        state["count"].index_add_(0, gs_ids, torch.ones_like(gs_ids, dtype=torch.float32).mul_(good))
        if self.refine_scale2d_stop_iter > 0:  # radii >= 0: a bad step's 0 keeps the running max
            scaled = torch.where(ok, radii / float(max(info["width"], info["height"])), 0.0)
            state["radii"][gs_ids] = torch.maximum(state["radii"][gs_ids], scaled)

    def initialize_state(self, scene_scale: float = 1.0, seed: int = 0) -> Dict[str, Any]:
        """gsplat's state plus "uid" (set by the trainer, else numbered at first growth)
        and the run's `seed` (the split's samples)."""
        return {**super().initialize_state(scene_scale=scene_scale), "uid": None, "seed": seed}

    def grow_masks(self, params: Dict[str, torch.Tensor], state: Dict[str, Any], step: int
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
        """gsplat's masks [N] of the Gaussians to duplicate (high 2D gradient, small) and to
        split (high gradient, large; or too large on screen while that rule is on)."""
        grads = state["grad2d"] / state["count"].clamp_min(1)  # [N]
        is_high = grads > self.grow_grad2d
        is_small = torch.exp(params["scales"]).max(dim=-1).values <= self.grow_scale3d * state["scene_scale"]
        is_split = is_high & ~is_small
        if step < self.refine_scale2d_stop_iter:
            is_split |= state["radii"] > self.grow_scale2d
        return is_high & is_small, is_split

    def growth_candidates(self, params: Dict[str, torch.Tensor], state: Dict[str, Any], step: int) -> int:
        """Gaussians the next `grow` adds: one per duplicated Gaussian, one per split
        (two replace one), with gsplat's masks (a Gaussian may be both)."""
        return sum(_counts(*self.grow_masks(params, state, step)))

    @torch.no_grad()
    def grow(self, params, optimizers, state, step) -> Tuple[int, int]:
        """gsplat's growth (duplicate first, then split; duplicates are not split), with ids
        and the split's samples drawn by id. The masks are computed once, their sizes read
        in one host transfer, which `growth_check` is asked with."""
        is_dupli, is_split = self.grow_masks(params, state, step)
        n_dupli, n_split = _counts(is_dupli, is_split)
        if self.growth_check is not None and not self.growth_check(params, n_dupli + n_split):
            return 0, 0
        ids_of(state, len(params["means"]), params["means"].device)  # a standalone state numbers its Gaussians now
        if n_dupli > 0:
            duplicate_with_ids(params, optimizers, state, is_dupli, step)
        if n_split > 0:
            is_split = torch.cat([is_split, is_split.new_zeros(n_dupli)])  # [N + n_dupli]
            split_with_ids(params, optimizers, state, is_split, step, state.get("seed", 0),
                           revised_opacity=self.revised_opacity)
        return n_dupli, n_split


def _counts(*masks: Tensor) -> Tuple[int, ...]:
    """The sizes of [N] masks, in one host transfer (refine steps only)."""
    return tuple(torch.stack([m.sum() for m in masks]).tolist())


@dataclass
class MCMCStrategy(MCMCStrategyBase):
    """gsplat's MCMCStrategy (relocate, add up to `cap_max`, noise), with adding behind
    `growth_check`."""

    growth_check: ClassVar[Optional[GrowthCheck]] = None

    def initialize_state(self, seed: int = 0) -> Dict[str, Any]:
        """gsplat's state (binoms) plus "uid" (see the module doc) and the run's seed."""
        return {**super().initialize_state(), "uid": None, "seed": seed}

    def step_post_backward(self, params, optimizers, state, step, info, lr, good: Optional[Tensor] = None) -> None:
        """gsplat's step (relocate, add, noise), then the ids of relocated and added rows.
        gsplat's relocate and add see no state (they are passed {}), so the ids are set
        here: a dead Gaussian (the same test as gsplat's, before relocation) is reborn.
        `good` ([] 1.0 or 0.0 on the device): the noise's lr is scaled by it, so a bad step
        moves no Gaussian (the noise is still drawn: the rank's stream advances as on any
        step)."""
        if good is not None:
            # float64: a good step's scale lr * noise_lr is gsplat's product to the last bit
            lr = good.to(torch.float64) * lr
        refine = self.refine_start_iter < step < self.refine_stop_iter and step % self.refine_every == 0
        if refine:
            ids = ids_of(state, len(params["means"]), params["means"].device)
            dead = self.dead_mask(params)  # [N]
        super().step_post_backward(params, optimizers, state, step, info, lr)
        if refine:
            ids = torch.where(dead, derive_ids(ids, step, RELOCATED), ids)
            n_new = len(params["means"]) - len(ids)
            state["uid"] = torch.cat([ids, derive_ids(ids[:n_new], step, ADDED)])

    @torch.no_grad()
    def add_new(self, params, optimizers, binoms) -> int:
        """gsplat's adding step, skipped when `growth_check` refuses its Gaussians."""
        if self.growth_check is not None and not self.growth_check(params, self.n_to_add(len(params["means"]))):
            return 0
        return super().add_new(params, optimizers, binoms)
