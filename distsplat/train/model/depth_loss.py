"""gsplat's depth loss (`--depth_loss`): the rendered expected depth at the pixels where an
image sees its sparse SfM points, compared in disparity with the points' depths.

Per-image state (docs/design.md): the targets of a camera are built from its COLMAP track
(the points whose track holds the image) and live only on the camera's owner, which
renders it with render_mode "RGB+ED" and adds the loss of its own cameras; nothing
crosses the wire beyond the render's own reverse exchange. As for the photometric loss,
each camera's term is summed over the owner's cameras and divided by the global batch,
so the ranks' gradients add up to the one-process gradient whatever W is. gsplat's term
per image: mean over its points of |1/d_render - 1/d_sfm| x scene scale, d_render read
with grid_sample(align_corners=True) at the projected point (gsplat's simple_trainer).

A scene without tracks (the built-in synthetic scene) uses every point in front of the
camera and inside its image, occluded or not: a stand-in for tests, said in a warning.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ...data import Scene

log = logging.getLogger(__name__)


def project_points(points: np.ndarray, viewmat: np.ndarray, K: np.ndarray, width: int, height: int
                   ) -> Dict[str, np.ndarray]:
    """points [P, 3] (float64 world) -> pixel coordinates [P', 2] and depths [P'] of those in
    front of the camera and inside the image (gsplat's selection)."""
    cam = points @ viewmat[:3, :3].T + viewmat[:3, 3]  # [P, 3]
    depth = cam[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        uv = (cam @ K.T)[:, :2] / depth[:, None]  # [P, 2]
    keep = (depth > 0) & (uv[:, 0] >= 0) & (uv[:, 0] < width) & (uv[:, 1] >= 0) & (uv[:, 1] < height)
    return {"uv": uv[keep], "depth": depth[keep]}


class DepthTargets:
    """The SfM depth targets of this rank's cameras (scene indices), built once at setup."""

    def __init__(self, scene: Scene, cameras: Sequence[int], width: Optional[int], height: Optional[int],
                 scene_scale: float, device: torch.device, warn: bool = False):
        """width, height: the images' size, or None for each camera's own (scene.widths/heights)."""
        if len(scene.points) == 0:
            raise ValueError("--depth_loss needs the scene's sparse SfM points (COLMAP points3D with tracks); "
                             "this scene has none: train without --depth_loss")
        if scene.point_tracks is None and warn:
            log.warning("--depth_loss: the scene has no COLMAP tracks; every sparse point in front of a camera "
                        "and inside its image is taken as seen by it (occlusion ignored)")
        self.width, self.height, self.scene_scale = width, height, scene_scale
        points = scene.points.astype(np.float64)
        self.targets: Dict[int, Dict[str, Tensor]] = {}
        for c in cameras:
            seen = points if scene.point_tracks is None else points[scene.point_tracks[c]]
            w = int(scene.widths[c]) if width is None else width
            h = int(scene.heights[c]) if height is None else height
            viewmat = np.linalg.inv(scene.camtoworlds[c])  # [4, 4] float64: the targets keep full precision
            p = project_points(seen, viewmat, scene.Ks[c], w, h)
            # gsplat's normalization for grid_sample(align_corners=True): pixel 0 -> -1, W-1 -> 1.
            grid = np.stack([p["uv"][:, 0] / (w - 1) * 2 - 1, p["uv"][:, 1] / (h - 1) * 2 - 1], -1)
            self.targets[int(c)] = {"grid": torch.from_numpy(grid).to(device),  # [P_c, 2]
                                    "depth": torch.from_numpy(p["depth"]).to(device)}  # [P_c]

    def points_of(self, camera: int) -> int:
        return len(self.targets[int(camera)]["depth"])

    def sample(self, depths: Tensor, cameras: List[int]) -> List[Tensor]:
        """depths [C_own, H, W, 1] (expected depth) -> per camera the rendered depth at its
        points [P_c]."""
        out = []
        for i, c in enumerate(cameras):
            t = self.targets[int(c)]
            grid = t["grid"].to(depths.dtype)[None, :, None, :]  # [1, P_c, 1, 2]
            d = F.grid_sample(depths[i:i + 1].permute(0, 3, 1, 2), grid, align_corners=True)  # [1, 1, P_c, 1]
            out.append(d[0, 0, :, 0])
        return out

    def loss(self, depths: Tensor, cameras: List[int]) -> Tensor:
        """Sum over the given cameras (rows of depths [C_own, H, W, 1]) of gsplat's
        disparity L1 x scene scale; a camera without points adds 0. Divide by the global
        batch, as the photometric loss."""
        total = depths.sum() * 0.0  # in the graph even with no camera or no point
        for c, d in zip(cameras, self.sample(depths, cameras)):
            gt = self.targets[int(c)]["depth"].to(d.dtype)
            if len(gt) == 0:
                continue
            disp = torch.where(d > 0.0, 1.0 / d.clamp_min(1e-10), torch.zeros_like(d))
            total = total + F.l1_loss(disp, 1.0 / gt) * self.scene_scale
        return total

    def disparity_error(self, depths: Tensor, cameras: List[int]) -> Dict[str, float]:
        """Sums for a metric: |1/d_render - 1/d_sfm| and |d_render - d_sfm| / d_sfm over the
        points, and the point count (no scene scale)."""
        abs_disp = rel = n = 0.0
        for c, d in zip(cameras, self.sample(depths, cameras)):
            gt = self.targets[int(c)]["depth"].to(d.dtype)
            disp = torch.where(d > 0.0, 1.0 / d.clamp_min(1e-10), torch.zeros_like(d))
            abs_disp += float((disp - 1.0 / gt).abs().sum())
            rel += float(((d - gt).abs() / gt).sum())
            n += len(gt)
        return {"abs_disp_sum": abs_disp, "abs_rel_sum": rel, "n": n}
