"""Visible (Gaussian, camera) pairs: the hand-off between projection and rasterization.

Stage (a) of the render (projection) turns N Gaussians x C cameras into M packed pairs;
stage (b) (rasterization) turns the pairs of C cameras into images. The distributed
render moves `Pairs` between ranks in between, so stage (b) must never assume that a
pair's Gaussian lives in this process: it only reads the per-pair fields below.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from torch import Tensor


@dataclass
class Pairs:
    """M visible (Gaussian, camera) pairs, packed, sorted by camera then Gaussian."""

    camera_ids: Tensor  # [M] int64, index into the batch's cameras
    gaussian_ids: Tensor  # [M] int64, index into the projecting process's Gaussians
    radii: Tensor  # [M, 2] int32, pixel half-extent of the screen-space bounding box
    means2d: Tensor  # [M, 2] pixel coordinates of the projected centre
    depths: Tensor  # [M] camera-space z
    conics: Tensor  # [M, 3] upper triangle (a, b, c) of the inverse 2D covariance
    opacities: Tensor  # [M] opacity, times the antialiasing compensation when used
    colors: Tensor  # [M, D] colour (SH already evaluated) or features

    def __len__(self) -> int:
        return self.camera_ids.shape[0]

    def select(self, index: Tensor) -> "Pairs":
        """The pairs at `index` (bool mask or int64 indices), gradients flowing back."""
        return Pairs(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def with_colors(self, colors: Tensor) -> "Pairs":
        return replace(self, colors=colors)
