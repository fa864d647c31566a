"""Pose optimization (`--pose_opt`): gsplat's CameraOptModule, one learned SE(3)
correction per training camera (a translation delta and a 6D rotation delta, zero at
start), and `--pose_noise`, gsplat's test perturbation of the training poses.

Per camera, needed for projection (docs/design.md): every rank holds every correction,
identical, because every rank projects its Gaussians into every batch camera. A
camera's correction therefore gets a gradient from every rank's Gaussians: after
backward the [n, 9] gradient is summed over ranks with ONE all-reduce per step (no
existing collective can carry it: the reverse all-to-all runs inside backward, before the
projection's camera gradients are complete), and every rank then takes the same Adam
step on the same summed gradient, so the copies stay bitwise identical.

gsplat composes the correction on the right of camera-to-world, c2w' = c2w @ T; on the
world-to-camera matrices the renderer takes that is viewmat' = T^-1 @ viewmat, with T^-1
in closed form (T is rigid): no matrix inverse in the step.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ...distributed import all_reduce_sum
from .gaussians import adam_step

IDENTITY_6D = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)


def rotation_6d_to_matrix(d6: Tensor) -> Tensor:
    """[..., 6] -> [..., 3, 3] by Gram-Schmidt, rows b1, b2, b3 (Zhou et al. 2019; gsplat's)."""
    a1, a2 = d6[..., :3], d6[..., 3:]
    b1 = F.normalize(a1, dim=-1)
    b2 = F.normalize(a2 - (b1 * a2).sum(-1, keepdim=True) * b1, dim=-1)
    b3 = torch.cross(b1, b2, dim=-1)
    return torch.stack((b1, b2, b3), dim=-2)


def correction_inverse(deltas: Tensor) -> Tensor:
    """deltas [C, 9] (translation 3, rotation 6D delta from identity) -> T^-1 [C, 4, 4] of
    T = [R dx; 0 1]."""
    dx, drot = deltas[:, :3], deltas[:, 3:]
    R = rotation_6d_to_matrix(drot + drot.new_tensor(IDENTITY_6D))  # [C, 3, 3]
    Rt = R.transpose(1, 2)
    top = torch.cat([Rt, -(Rt @ dx[:, :, None])], dim=2)  # [C, 3, 4]
    bottom = deltas.new_tensor([0.0, 0.0, 0.0, 1.0]).expand(len(deltas), 1, 4)
    return torch.cat([top, bottom], dim=1)


class PoseCorrections:
    """Every training camera's correction [n, 9] and its Adam (gsplat: lr x sqrt(batch),
    weight decay = --pose_opt_reg), identical on every rank."""

    def __init__(self, n: int, lr: float, reg: float, global_batch: int, device: torch.device,
                 dtype: torch.dtype = torch.float32):
        self.lr, self.reg, self.global_batch = lr, reg, global_batch
        self.deltas = torch.nn.Parameter(torch.zeros(n, 9, device=device, dtype=dtype))  # [n, 9]
        self._make_optimizer()

    def _make_optimizer(self) -> None:
        # fused: the one Adam that skips a diverged step on the device (gaussians.adam_step)
        self.optimizer = torch.optim.Adam([self.deltas], lr=self.lr * math.sqrt(self.global_batch),
                                          weight_decay=self.reg, fused=True)

    def to(self, dtype: torch.dtype) -> None:
        """Another dtype (tests train in float64), with a fresh optimizer."""
        self.deltas = torch.nn.Parameter(self.deltas.detach().to(dtype))
        self._make_optimizer()

    def apply(self, viewmats: Tensor, cameras: Tensor) -> Tensor:
        """viewmats [C, 4, 4] of training cameras `cameras` [C] (positions among them) ->
        corrected [C, 4, 4], differentiable in the corrections."""
        return correction_inverse(self.deltas[cameras].to(viewmats.dtype)) @ viewmats

    def step(self, found_inf: Optional[Tensor] = None) -> None:
        """After backward, on every rank: the gradient summed over ranks (one all-reduce),
        then the same Adam step everywhere (none where `found_inf` [] is 1.0: the divergence
        check, which read every rank's own gradient before this sum)."""
        grad = self.deltas.grad if self.deltas.grad is not None else torch.zeros_like(self.deltas)
        self.deltas.grad = all_reduce_sum(grad)
        adam_step(self.optimizer, found_inf)
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> Dict[str, Any]:
        return {"deltas": self.deltas.detach().cpu(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state["deltas"].shape != self.deltas.shape:
            raise ValueError(f"the checkpoint's pose corrections are for {state['deltas'].shape[0]} training "
                             f"cameras, this scene has {self.deltas.shape[0]}")
        # The saved values and dtype, exactly (a float64 run resumes as one).
        self.deltas = torch.nn.Parameter(state["deltas"].to(self.deltas.device))
        self._make_optimizer()
        self.optimizer.load_state_dict(state["optimizer"])


def perturb_poses(viewmats: Tensor, std: float, seed: int) -> Tensor:
    """gsplat's --pose_noise: every camera's pose moved by a correction drawn N(0, std) per
    component (translation in world units, rotation in the 6D delta), the same draw on
    every rank (a seeded generator, not the rank's RNG). viewmats [C, 4, 4]."""
    g = torch.Generator().manual_seed(seed * 7919 + 17)
    noise = torch.randn(len(viewmats), 9, generator=g, dtype=torch.float64) * std
    return (correction_inverse(noise) @ viewmats.detach().cpu().double()).to(viewmats)


def setup_pose_opt(cfg, scene, train: np.ndarray, global_batch: int, device: torch.device
                   ) -> Tuple[Optional[Tensor], Optional[PoseCorrections]]:
    """The trainer's one call, for the training cameras `train` [C_train] (scene indices):
    their world-to-camera matrices perturbed by --pose_noise [C_train, 4, 4] float32 on the
    host (what they render with instead of scene.viewmats; None without the flag), and the
    corrections when --pose_opt (else None)."""
    noisy = perturb_poses(scene.viewmats(train), cfg.pose_noise, cfg.seed) if cfg.pose_noise > 0 else None
    if not cfg.pose_opt:
        return noisy, None
    return noisy, PoseCorrections(len(train), cfg.pose_opt_lr, cfg.pose_opt_reg, global_batch, device)
