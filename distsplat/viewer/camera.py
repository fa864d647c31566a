"""The viewer's cameras and its one message (docs/design.md: the viewer asks the trainer for
distributed renders between steps).

A browser's camera (viser: camera-to-world rotation `wxyz` and `position` in OpenCV axes,
vertical field of view, viewport aspect) becomes a `ViewCamera`: the world-to-camera
matrix and intrinsics every rank passes to `distributed_rasterize`. Rank 0 packs the
camera, the pause flag and the next poll interval into one small float64 vector that is
broadcast at a poll step, so every rank renders the same camera and agrees on pausing.
Pure functions, no process group: unit-testable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

MIN_SIDE = 16  # the smallest image the resolution control allows


@dataclass(frozen=True)
class ViewCamera:
    """One render request: viewmat [4, 4] world-to-camera (OpenCV), pinhole intrinsics."""

    viewmat: np.ndarray  # [4, 4] float64
    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int

    def tensors(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """viewmats [1, 4, 4], Ks [1, 3, 3] float32 on `device`, as the render takes them."""
        K = np.array([[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]])
        return (torch.as_tensor(self.viewmat, dtype=torch.float32, device=device)[None],
                torch.as_tensor(K, dtype=torch.float32, device=device)[None])


def quat_to_matrix(wxyz: Sequence[float]) -> np.ndarray:
    """[3, 3] rotation of a (w, x, y, z) quaternion (normalized here)."""
    w, x, y, z = np.asarray(wxyz, dtype=np.float64) / np.linalg.norm(wxyz)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def render_size(aspect: float, max_side: int) -> tuple[int, int]:
    """(width, height) with the viewport's aspect and the longer side = max_side."""
    if not (math.isfinite(aspect) and aspect > 0):
        aspect = 4.0 / 3.0
    max_side = max(int(max_side), MIN_SIDE)
    if aspect >= 1.0:
        return max_side, max(MIN_SIDE, round(max_side / aspect))
    return max(MIN_SIDE, round(max_side * aspect)), max_side


def view_camera(
    wxyz: Sequence[float],  # [4] camera-to-world rotation (viser's camera.wxyz)
    position: Sequence[float],  # [3] camera centre in the world
    fov_y: float,  # vertical field of view, radians
    aspect: float,  # viewport width / height
    max_side: int,
) -> ViewCamera:
    """A browser camera as the render's camera, at most max_side pixels on a side."""
    c2w = np.eye(4)
    c2w[:3, :3] = quat_to_matrix(wxyz)
    c2w[:3, 3] = np.asarray(position, dtype=np.float64)
    width, height = render_size(aspect, max_side)
    fy = 0.5 * height / math.tan(0.5 * min(max(fov_y, 1e-3), math.pi - 1e-3))
    return ViewCamera(np.linalg.inv(c2w), fy, fy, width / 2.0, height / 2.0, width, height)


def initial_view(camtoworlds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(position, look_at, up) [3] each for a browser's first view: the first camera's
    pose, looking along its axis as far as the cameras' centroid, up = their mean up."""
    c2w = np.asarray(camtoworlds, dtype=np.float64)  # [C, 4, 4]
    position = c2w[0, :3, 3]
    forward = c2w[0, :3, 2]
    distance = max(float(np.linalg.norm(position - c2w[:, :3, 3].mean(0))), 1e-2)
    up = -c2w[:, :3, 1].mean(0)  # OpenCV: y points down
    if np.linalg.norm(up) < 1e-6:
        up = -c2w[0, :3, 1]
    return position, position + distance * forward, up / np.linalg.norm(up)


# ------------------------------------------------------------------ the poll message

RENDER, PAUSED, STOP = 1, 2, 4  # flag bits
_N = 24  # flags, interval, width, height, viewmat (16), fx, fy, cx, cy


@dataclass(frozen=True)
class PollMessage:
    """What rank 0 decided at a poll step, identical on every rank after the broadcast."""

    interval: int  # steps until the next poll (>= 1)
    paused: bool = False
    stop: bool = False
    camera: Optional[ViewCamera] = None  # set: every rank takes part in rendering it

    def pack(self, device: torch.device) -> Tensor:
        """[24] float64 (exact for every integer here and for the camera's floats)."""
        v: List[float] = [0.0] * _N
        v[0] = float((RENDER if self.camera is not None else 0) | (PAUSED if self.paused else 0)
                     | (STOP if self.stop else 0))
        v[1] = float(self.interval)
        if self.camera is not None:
            c = self.camera
            v[2], v[3] = float(c.width), float(c.height)
            v[4:20] = np.asarray(c.viewmat, dtype=np.float64).reshape(16).tolist()
            v[20:24] = [c.fx, c.fy, c.cx, c.cy]
        return torch.tensor(v, dtype=torch.float64, device=device)

    @staticmethod
    def empty(device: torch.device) -> Tensor:
        """The receive buffer of the ranks that do not decide."""
        return torch.zeros(_N, dtype=torch.float64, device=device)

    @classmethod
    def unpack(cls, v: Sequence[float]) -> "PollMessage":
        flags = int(v[0])
        camera = None
        if flags & RENDER:
            camera = ViewCamera(np.asarray(v[4:20], dtype=np.float64).reshape(4, 4),
                                v[20], v[21], v[22], v[23], int(v[2]), int(v[3]))
        return cls(interval=max(1, int(v[1])), paused=bool(flags & PAUSED),
                   stop=bool(flags & STOP), camera=camera)
