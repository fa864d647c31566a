"""Per-image bilateral grids (`--use_bilateral_grid`), gsplat 1.5.3's appearance correction
for captures whose exposure and white balance change from frame to frame (Wang et al.,
"Bilateral Guided Radiance Field Processing", SIGGRAPH 2024), on any number of ranks.

Each training image i has a grid of 3x4 affine colour transforms, [12, L, Y, X] (X x Y cells
over the image, L over the rendered colour's luminance; --bilateral_grid_shape X Y L, gsplat's
16 16 8), identity at start. A rendered pixel at (x, y) with colour c is looked up in image i's
grid trilinearly at (x, y, gray(c)) (gray: BT.601 luma mapped to [-1, 1]; the grid's corners at
the image's corners and the luma's ends, clamped outside), and its colour becomes A[:, :3] c +
A[:, 3]: the training loss sees the rendered image as that camera's ISP would have made it,
so the Gaussians keep the scene's own colours. Test images, paths and the PLY use no grid;
the evaluation reports gsplat's colour-corrected scores beside the plain ones
(color_correct.py). gsplat's loss adds 10 x the grids' total variation (squared differences of
neighbouring cells along each axis, each axis' sum over its count, over the number of grids),
and its Adam (lr 2e-3 x sqrt(batch), eps 1e-15) warms up linearly from 1% over 1000 steps
while decaying exponentially to 1% over the run.

Where the state lives (docs/design.md): a grid is per image, so it lives on the image's
owner, the rank that renders that camera and computes its loss: its gradient (the loss's and
the total variation's) is complete there and needs no collective. Adam is elementwise, and
every grid steps every step (the total variation reaches every grid, as in gsplat, where the
indexing of all grids makes their gradient dense), so each rank's Adam over its own grids
takes exactly the steps of one process's Adam over all. The total variation is a sum over
grids: each rank adds its own grids' share, and the ranks' losses sum to gsplat's. A
checkpoint holds every grid (the owners' rows summed into one table, one all-reduce per save)
in shard 0, and resumes on any W. Learning rates follow the global batch B as the other
extras' (app_opt.py): 2e-3 x sqrt(B); the warm-up's 1000 steps are scaled like every other
step count (--steps_scaler, --schedule_in_images)."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ...distributed import all_reduce_sum
from ...transfer import to_device
from .gaussians import adam_step

LR, EPS = 2e-3, 1e-15  # gsplat 1.5.3's grid optimizer
TV_WEIGHT = 10.0  # gsplat's weight of the grids' total variation in the loss
WARMUP_STEPS, START_FACTOR, END_FACTOR = 1000, 0.01, 0.01  # linear warm-up from 1%, decay to 1% of lr
GRAY = (0.299, 0.587, 0.114)  # BT.601 luma: the guidance


def identity_grids(n: int, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> Tensor:
    """[n, 12, L, Y, X] grids of the identity transform (shape = (X, Y, L), gsplat's order)."""
    X, Y, L = shape
    eye = torch.eye(3, 4, dtype=dtype).reshape(12)  # A = [I | 0], row-major
    return eye[None, :, None, None, None].expand(n, 12, L, Y, X).contiguous()


def slice_grids(
    grids: Tensor,  # [C, 12, L, Y, X] one grid per image
    rgb: Tensor,  # [C, H, W, 3] rendered colours
) -> Tensor:
    """[C, H, W, 3]: every pixel's colour through its image's grid at (its position, its luma)."""
    C, H, W, _ = rgb.shape
    y = (torch.arange(H, device=rgb.device, dtype=rgb.dtype) + 0.5) / H * 2 - 1  # pixel centres in [-1, 1]
    x = (torch.arange(W, device=rgb.device, dtype=rgb.dtype) + 0.5) / W * 2 - 1
    z = (rgb @ rgb.new_tensor(GRAY)) * 2 - 1  # [C, H, W] luma in [-1, 1]
    xy = torch.stack(torch.meshgrid(x, y, indexing="xy"), -1).expand(C, H, W, 2)
    where = torch.cat([xy, z[..., None]], -1)[:, None]  # [C, 1, H, W, 3] (x, y, z) -> (X, Y, L)
    A = F.grid_sample(grids.to(rgb.dtype), where, mode="bilinear", padding_mode="border", align_corners=True)
    A = A[:, :, 0].permute(0, 2, 3, 1).reshape(C, H, W, 3, 4)  # [C, H, W, 3, 4]
    return (A[..., :3] @ rgb[..., None])[..., 0] + A[..., 3]


def total_variation(grids: Tensor, n_all: int) -> Tensor:
    """gsplat's total variation of all n_all grids, this rank's share: for each of the grid's
    axes (L, Y, X) the squared differences of neighbouring cells summed over `grids` [n, 12,
    L, Y, X] and divided by the cells of one grid's differences, the axes summed, over n_all."""
    tv = grids.new_zeros(())
    for axis in (2, 3, 4):
        d = grids.diff(dim=axis)
        tv = tv + d.square().sum() / max(math.prod(d.shape[1:]), 1)
    return tv / n_all


def lr_factor(step: int, max_steps: int, warmup: int) -> float:
    """gsplat's ChainedScheduler(LinearLR(0.01 -> 1 over `warmup` steps), ExponentialLR(0.01 over
    the run)): the learning rate's factor at loop step `step` (0-based: the update it makes)."""
    warm = START_FACTOR + (1 - START_FACTOR) * min(step, warmup) / max(warmup, 1)
    return warm * END_FACTOR ** (step / max_steps)


class BilateralGrids:
    """This rank's grids (its own training images', by training position) and their Adam."""

    def __init__(self, n_train: int, own: Tensor, shape: Sequence[int], global_batch: int, max_steps: int,
                 warmup: int, device: torch.device, dtype: torch.dtype = torch.float32):
        self.n_train, self.shape, self.global_batch = n_train, tuple(int(s) for s in shape), global_batch
        self.max_steps, self.warmup = max_steps, warmup
        self.own = own.to(torch.int64).cpu()  # [n_own] training positions this rank owns
        # Training position -> local row (others: -1, never rendered here)
        self.row = np.full(n_train, -1, dtype=np.int64)
        self.row[self.own.numpy()] = np.arange(len(self.own))
        self.grids = torch.nn.Parameter(identity_grids(len(self.own), self.shape, dtype).to(device))
        self._make_optimizer()

    def _make_optimizer(self) -> None:
        # fused: the one Adam that skips a diverged step on the device (gaussians.adam_step)
        self.optimizer = torch.optim.Adam([self.grids], lr=self.base_lr, eps=EPS, fused=True)

    @property
    def base_lr(self) -> float:
        return LR * math.sqrt(self.global_batch)

    def to(self, dtype: torch.dtype) -> None:
        """Another dtype (tests train in float64), with a fresh optimizer."""
        self.grids = torch.nn.Parameter(self.grids.detach().to(dtype))
        self._make_optimizer()

    # ------------------------------------------------------------------------ the step
    def correct(self, colors: Tensor, alphas: Tensor, group: Any, cameras: np.ndarray, rank: int,
                backgrounds: Optional[Tensor] = None) -> Tensor:
        """This rank's own rendered images of a size group [C_own_g, H, W, D] (RGB first, rendered
        with no background) through their grids, then --random_bkgd's `backgrounds` [C, 3] (the
        batch's) composited on `alphas` [C_own_g, H, W, 1], as gsplat orders them. `cameras` [C]:
        the batch's training positions; `group`: size_groups.SizeGroup."""
        at = [p for p, o in zip(group.positions.tolist(), group.owner) if o == rank]  # own batch positions
        if not at:
            return colors
        rows = self.row[cameras[at]]
        assert (rows >= 0).all(), "a rank corrects only its own images"
        rgb = slice_grids(self.grids[to_device(torch.from_numpy(rows), self.grids.device)], colors[..., :3])
        if backgrounds is not None:
            rgb = rgb + backgrounds[to_device(torch.tensor(at), backgrounds.device)][:, None, None, :] * (1.0 - alphas)
        return torch.cat([rgb, colors[..., 3:]], -1) if colors.shape[-1] > 3 else rgb

    def tv_loss(self) -> Tensor:
        """This rank's share of gsplat's 10 x total variation (the ranks' shares sum to it)."""
        return TV_WEIGHT * total_variation(self.grids, self.n_train)

    def grads(self) -> Dict[str, Tensor]:
        """The learned tensor, for the divergence guard's finiteness check."""
        return {"bilateral_grids": self.grids}

    def step(self, step: int, found_inf: Optional[Tensor] = None) -> None:
        """After backward: Adam on this rank's grids at gsplat's scheduled lr (no collective:
        a grid's gradient is complete on its owner); none where `found_inf` [] is 1.0."""
        self.optimizer.param_groups[0]["lr"] = self.base_lr * lr_factor(step, self.max_steps, self.warmup)
        if self.grids.grad is None:  # nothing of this rank in the step's loss: Adam still steps
            self.grids.grad = torch.zeros_like(self.grids)
        adam_step(self.optimizer, found_inf)
        self.optimizer.zero_grad(set_to_none=True)

    # ---------------------------------------------------------------------- checkpoint
    def state_dict(self) -> Dict[str, Any]:
        """Every rank calls it (one all-reduce): every image's grid and its Adam moments
        [n_train, 12, L, Y, X] (owners' rows summed into zeros) and the step count."""
        st = self.optimizer.state.get(self.grids, {})
        parts = [self.grids.detach()] + [st.get(k, torch.zeros_like(self.grids)).detach()
                                         for k in ("exp_avg", "exp_avg_sq")]
        full = self.grids.new_zeros(3, self.n_train, *self.grids.shape[1:])
        full[:, self.own.to(full.device)] = torch.stack(parts)
        full = all_reduce_sum(full).cpu()
        return {"grids": full[0], "exp_avg": full[1], "exp_avg_sq": full[2], "shape": list(self.shape),
                "step": st.get("step", torch.tensor(0.0)).detach().cpu()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """This rank's grids of a checkpoint written on any W."""
        want = (self.n_train, 12, self.shape[2], self.shape[1], self.shape[0])
        if tuple(state["grids"].shape) != want:
            X, Y, L = state["shape"]
            raise ValueError(f"the checkpoint holds bilateral grids of {state['grids'].shape[0]} training images "
                             f"at --bilateral_grid_shape {X} {Y} {L}, this run needs {self.n_train} at "
                             f"{' '.join(map(str, self.shape))}: pass the scene and shape it was trained with")
        dev, own = self.grids.device, self.own
        self.grids = torch.nn.Parameter(state["grids"][own].to(dev))  # the saved values and dtype
        self._make_optimizer()
        if float(state["step"]) > 0:  # a fused Adam's step counter: float32 beside its parameter
            self.optimizer.state[self.grids] = {"step": state["step"].to(dev, torch.float32, copy=True),
                                                "exp_avg": state["exp_avg"][own].to(dev),
                                                "exp_avg_sq": state["exp_avg_sq"][own].to(dev)}

    def table(self) -> Tensor:
        """[n_train, 12, L, Y, X] with this rank's grids and NaN elsewhere (tests)."""
        out = torch.full((self.n_train, *self.grids.shape[1:]), float("nan"), dtype=self.grids.dtype)
        out[self.own] = self.grids.detach().cpu()
        return out


def setup_bilateral_grid(cfg: Any, n_train: int, own: Tensor, world_size: int,
                         device: torch.device) -> Optional[BilateralGrids]:
    """The trainer's one call: the grids of this rank's own training images (`own` [n_own]
    training positions, the batcher's) with --use_bilateral_grid, else None. The warm-up's
    1000 steps are scaled as the flags' step counts were (Config.schedule_factor)."""
    if not cfg.use_bilateral_grid:
        return None
    warmup = max(1, int(WARMUP_STEPS * cfg.schedule_factor(world_size)))
    return BilateralGrids(n_train, own, cfg.bilateral_grid_shape, cfg.batch_size * world_size, cfg.max_steps,
                          warmup, device)

