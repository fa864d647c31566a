"""How the learning rates grow with the global batch B (issue 30): a step at batch B should
move the Gaussians as far as B one-image steps would, so that a W-times larger batch run for
W-times fewer steps reaches the same quality at the same images seen.

With Adam the answer depends on how many of the batch's images see a Gaussian. Model a
Gaussian's per-image gradient as g where an image sees it (probability p) and 0 elsewhere.
B one-image Adam steps (second moment ~ p g^2, first ~ p g) move it lr B sqrt(p). One batch
step (the mean over B images: mean p g, variance p (1 - p) g^2 / B) moves it
lr_B p / sqrt(p^2 + p (1 - p) / B). Equal when

    lr_B = lr sqrt(B (1 + (B - 1) p))

- every image sees every Gaussian (p = 1): lr x B, the linear rule;
- each Gaussian is seen by about one image of the batch (p <= 1/B, large scenes): lr x sqrt(B),
  gsplat's and Grendel-GS's rule (Grendel's "independent gradients" case).
Object-centric captures sit near p = 1 (the built-in scene ~0.6-0.9, thermos ~0.3-0.8), where
sqrt(B) moves the Gaussians sqrt(B) times too little per image: after an opacity reset they
take that many more images to recover (benchmarks/studies/batch_quality/batch_quality.py).

`--lr_batch_scaling visibility` (the default) measures p once, as training starts: the fraction of
(Gaussian, camera) pairs visible over an evenly spaced sample of the training cameras, summed
over the ranks (exact integer counts: the same p on any W), and keeps it for the run (saved
in checkpoints, so a resume scales as the run did). `sqrt` and `linear` are the two limits.
MCMC's position noise keeps sqrt(B) whatever the rule: its random walk per image is what
sqrt(B) preserves. Adam's betas are scaled by create_optimizers (B one-image decays)."""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import torch

from ..distributed import all_reduce_sum
from ..render.api import project
from ..render.checks import resolve_backend

log = logging.getLogger(__name__)

RULES = ("visibility", "sqrt", "linear")
SAMPLE = 32  # training cameras projected to measure p


def lr_factor(rule: str, batch: int, p: Optional[float] = None) -> float:
    """What every learning rate is multiplied by at global batch `batch` (module doc)."""
    if rule == "sqrt" or batch == 1:
        return math.sqrt(batch)
    if rule == "linear":
        return float(batch)
    if rule != "visibility" or p is None:
        raise ValueError(f"--lr_batch_scaling {rule}: expected one of {', '.join(RULES)}")
    return math.sqrt(batch * (1.0 + (batch - 1) * min(max(p, 0.0), 1.0)))


def sample(cameras: np.ndarray) -> np.ndarray:
    """Up to SAMPLE of `cameras`, evenly spaced (the same on every rank and any W)."""
    return cameras[np.linspace(0, len(cameras) - 1, min(SAMPLE, len(cameras))).round().astype(int)]


@torch.no_grad()
def visible_fraction(g: Dict[str, torch.Tensor], viewmats: torch.Tensor, Ks: torch.Tensor,
                     widths: Sequence[int], heights: Sequence[int], *,
                     backend: str, near_plane: float, far_plane: float) -> float:
    """p: visible (Gaussian, camera) pairs over Gaussians x cameras for the cameras given
    (viewmats [C, 4, 4], Ks [C, 3, 3], sizes [C]), this rank's Gaussians `g` (activated),
    summed over every rank (one all-reduce; none at W = 1)."""
    device = g["means"].device
    backend = resolve_backend("visible_fraction", backend, device)
    pairs, rgb = 0, g["means"].new_zeros(len(g["means"]), 3)  # colours do not change what is visible
    for c in range(len(Ks)):  # one camera at a time: cameras may differ in size
        found, _ = project(g["means"], g["quats"], g["scales"], g["opacities"], rgb,
                           viewmats[c:c + 1].to(device), Ks[c:c + 1].to(device), int(widths[c]), int(heights[c]),
                           backend=backend, near_plane=near_plane, far_plane=far_plane)
        pairs += len(found)
    counts = all_reduce_sum(torch.tensor([float(pairs), float(len(g["means"]) * len(Ks))], dtype=torch.float64,
                                         device=device))
    return float(counts[0] / counts[1]) if counts[1] > 0 else 1.0


def for_global_batch(rule: str, batch: int, saved: Optional[Dict[str, Any]],
                     gaussians: Callable[[], Dict[str, torch.Tensor]],
                     viewmats: Callable[[np.ndarray], torch.Tensor], Ks: torch.Tensor,
                     widths: np.ndarray, heights: np.ndarray, train: np.ndarray, *, backend: str,
                     near_plane: float, far_plane: float) -> Dict[str, Any]:
    """The learning-rate scaling of global batch `batch` ({rule, global_batch, visible_fraction,
    factor}): with the visibility rule, p as a resumed run measured it (`saved`, for the same
    rule and batch), else measured now on a sample of the training cameras `train` (scene
    indices; Ks, widths, heights: [C_all]) and the activated `gaussians()`. viewmats(positions):
    the [C, 4, 4] world-to-camera matrices of the training cameras at `positions` [C] as they
    render (Trainer.train_viewmats: --pose_noise's, where given)."""
    saved, p = saved or {}, None
    if rule == "visibility" and batch > 1:
        p = saved.get("visible_fraction") if (saved.get("rule"), saved.get("global_batch")) == (rule, batch) else None
        if p is None:
            pos = sample(np.arange(len(train)))  # [<= SAMPLE] positions among the training cameras
            cams = train[pos]  # their scene indices
            p = visible_fraction(gaussians(), viewmats(pos), Ks[torch.from_numpy(cams)], widths[cams], heights[cams],
                                 backend=backend, near_plane=near_plane, far_plane=far_plane)
    return {"rule": rule, "global_batch": batch, "visible_fraction": p, "factor": lr_factor(rule, batch, p)}


def scale_learning_rates(optimizers: Dict[str, torch.optim.Optimizer], batch: int, factor: float) -> None:
    """From create_optimizers' lr x sqrt(B) to lr x factor."""
    if factor == math.sqrt(batch):
        return
    for opt in optimizers.values():
        for group in opt.param_groups:
            group["lr"] = group["lr"] / math.sqrt(batch) * factor


def describe(info: Dict[str, Any]) -> str:
    """Rank 0's line: the rule, B, p and the factor."""
    B, rule, f = info["global_batch"], info["rule"], info["factor"]
    seen = "" if info.get("visible_fraction") is None else f", {info['visible_fraction']:.3f} of the cameras see a Gaussian"
    return (f"learning rates x {f:.3g} for the global batch {B} (--lr_batch_scaling {rule}{seen}; "
            f"sqrt(B) = {math.sqrt(B):.3g}, B = {B})")


class LrRule:
    """The run's learning-rate scaling as a checkpoint holds it (Stateful): `current`, the
    scaling in use ({rule, global_batch, visible_fraction, factor}); `saved`, a resumed run's,
    which `for_global_batch` reuses for the same rule and global batch."""

    def __init__(self, current: Dict[str, Any]):
        self.current: Dict[str, Any] = current
        self.saved: Optional[Dict[str, Any]] = None

    def state_dict(self) -> Dict[str, Any]:
        return self.current

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.saved = state
