"""`Scene`: what every parser returns and every rank holds in full (docs/design.md: "every rank
holds the parameters of all cameras"). Cameras are tiny, so all of them live here; the
images do not: `Scene.images` is an `ImageSource` that reads one camera's encoded image
when the rank that owns the camera asks for it.

Conventions (gsplat's): camera-to-world and world-to-camera matrices in OpenCV axes
(x right, y down, z forward); intrinsics `Ks` already scaled to the size the images are
loaded at (`--data_factor`), and `widths`/`heights` are that size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .decode import ImageSpec
from .names import NameList
from .poses import CameraPoses, compact_poses
from .sources import ImageSource

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger(__name__)


@dataclass
class Scene:
    names: Sequence[str]  # [C_all] image names, sorted as gsplat sorts them (by name); a list or a NameList
    # [C_all, 4, 4] float64, OpenCV axes: stored as CameraPoses ([C_all, 3, 4], poses.py) when
    # every bottom row is [0, 0, 0, 1], which reads back as the same array, bit for bit
    camtoworlds: Union[np.ndarray, CameraPoses]
    Ks: np.ndarray  # [C_all, 3, 3] float64, at the loaded image size
    widths: np.ndarray  # [C_all] int64, loaded image width
    heights: np.ndarray  # [C_all] int64, loaded image height
    points: np.ndarray  # [P, 3] float32 sparse points (initialisation)
    points_rgb: np.ndarray  # [P, 3] uint8
    train: np.ndarray  # [C_train] int64 camera indices
    test: np.ndarray  # [C_test] int64 camera indices
    images: Optional[ImageSource]  # encoded images by camera index; None until a synthetic scene is rendered
    source_sizes: Optional[np.ndarray] = None  # [C_all, 2] (w, h) of the stored images when resized or undistorted on load
    background: Optional[Tuple[int, int, int]] = None  # RGB that RGBA images are composited on
    transform: np.ndarray = field(default_factory=lambda: np.eye(4))  # [4, 4] normalised world = transform @ input world
    gaussians: Optional[Dict[str, np.ndarray]] = None  # ground-truth Gaussians of a synthetic scene
    # Per camera, the indices into `points` of the SfM points its image sees (COLMAP tracks;
    # the depth loss's targets): a list of arrays or a TrackTable; None when the scene has no tracks.
    point_tracks: Optional[Sequence[np.ndarray]] = None
    kind: str = "colmap"
    # [C_all] undistort.Undistortion (shared by a distorted camera's images) or None: Ks,
    # widths and heights are then already the undistorted pinhole camera's.
    undistort: Optional[List[object]] = None

    def __post_init__(self) -> None:
        C = len(self.names)
        expect = {"camtoworlds": (C, 4, 4), "Ks": (C, 3, 3), "widths": (C,), "heights": (C,)}
        for key, shape in expect.items():
            if getattr(self, key).shape != shape:
                raise ValueError(f"Scene.{key} has shape {getattr(self, key).shape}, expected {shape}")
        if self.points.ndim != 2 or self.points.shape[1] != 3 or self.points_rgb.shape != self.points.shape:
            raise ValueError(f"Scene.points {self.points.shape} and points_rgb {self.points_rgb.shape} must both be [P, 3]")
        if self.undistort is not None and len(self.undistort) != C:
            raise ValueError(f"Scene.undistort has {len(self.undistort)} entries for {C} cameras")
        if self.names.has_duplicates() if isinstance(self.names, NameList) else len(set(self.names)) != C:
            raise ValueError("Scene.names has duplicates")
        self.camtoworlds = compact_poses(self.camtoworlds)  # one copy of the poses per rank (issue 20)

    @property
    def num_cameras(self) -> int:
        return len(self.names)

    def viewmats(self, idx, device=None) -> Tensor:
        """[len(idx), 4, 4] float32 world-to-camera (OpenCV axes) of cameras `idx` (what numpy
        indexes with: an int64 array, a slice), what the renderer takes, on `device`. Computed
        per call from camtoworlds, so no rank holds a second copy of every pose (issue 20):
        numpy inverts each 4x4 on its own, so this equals float32(inv(camtoworlds))[idx] bit
        for bit, whichever cameras are asked for together."""
        import torch

        from ..transfer import to_device

        inv = np.linalg.inv(np.asarray(self.camtoworlds[idx], dtype=np.float64))  # [C, 4, 4] float64
        out = torch.from_numpy(inv.astype(np.float32))  # rounds to nearest, as torch's cast
        return out if device is None else to_device(out, device)  # pinned and queued: no host stall per step

    def camera_tensors(self, dtype=None, device=None) -> Dict[str, Tensor]:
        """Torch-ready intrinsics Ks [C_all, 3, 3] and widths/heights [C_all]; the poses are
        not among them: viewmats() computes a batch's."""
        import torch

        dtype = dtype or torch.float32
        return {
            "Ks": _tensor(self.Ks, dtype, device),
            "widths": _tensor(self.widths, torch.int64, device),
            "heights": _tensor(self.heights, torch.int64, device),
        }

    def spec(self, index: int) -> ImageSpec:
        """How camera `index`'s stored image becomes its [H, W, 3] uint8 training image."""
        w, h = int(self.widths[index]), int(self.heights[index])
        src = (w, h) if self.source_sizes is None else tuple(int(v) for v in self.source_sizes[index])
        und = self.undistort[index] if self.undistort is not None else None
        return ImageSpec(self.names[index], w, h, src[0], src[1], self.background, und)

    def specs(self, indices: Optional[Sequence[int]] = None) -> Sequence[ImageSpec]:
        """Specs of `indices`; of every camera (None) as a lazy sequence: a rank only ever
        asks for its own cameras', and a million ImageSpec objects cost ~150 MB per rank."""
        if indices is None:
            return _LazySpecs(self)
        return [self.spec(i) for i in indices]

    def decoded_nbytes(self, indices: Optional[Sequence[int]] = None) -> int:
        idx = np.arange(self.num_cameras) if indices is None else np.asarray(indices, dtype=np.int64)
        return int((self.widths[idx] * self.heights[idx] * 3).sum())


def _tensor(a: np.ndarray, dtype, device):
    """torch tensor of `a`; a broadcast view (one K or size shared by every camera, as
    colmap.py builds them for large captures) stays an expanded tensor, no bytes per camera."""
    import torch

    if a.ndim and a.strides[0] == 0:
        return torch.as_tensor(np.array(a[:1]), dtype=dtype, device=device).expand(a.shape)
    return torch.as_tensor(a, dtype=dtype, device=device)


class _LazySpecs(Sequence):
    """scene.spec(i) on access (issue 20: million-image captures)."""

    def __init__(self, scene: "Scene"):
        self._scene = scene

    def __len__(self) -> int:
        return self._scene.num_cameras

    def nbytes_of(self, indices: np.ndarray) -> np.ndarray:
        """[N] int64 decoded bytes (H x W x 3) of the cameras `indices`, without N specs."""
        s = self._scene
        return s.widths[indices].astype(np.int64) * s.heights[indices] * 3

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._scene.spec(j) for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self._scene.spec(i % len(self))


def split_every(names: Sequence[str], test_every: int) -> Tuple[np.ndarray, np.ndarray]:
    """gsplat's split over name-sorted images: index % test_every == 0 -> test, the rest train."""
    idx = np.arange(len(names))
    if test_every <= 0:
        return idx, idx[:0]
    is_test = idx % test_every == 0
    return idx[~is_test], idx[is_test]
