"""One copy of the camera poses per rank (issue 20: a million images, <= 200 MB per rank
besides the image cache). Every rank holds every camera's pose (docs/design.md); at a million
cameras the scene's float64 camera-to-world matrices [C, 4, 4] are 122 MiB, and the
trainer's float32 world-to-camera copy of them another 61 MiB. Here:

- `CameraPoses`: the scene's camera-to-world matrices held as their top three rows
  [C, 3, 4] float64 (the bottom row of a rigid or similarity pose is [0, 0, 0, 1]; 92 MiB
  at a million cameras). It reads as the [C, 4, 4] float64 array it replaces: `poses[i]`,
  `poses[idx]`, `poses[:, :3, 3]`, `len`, `.shape`, `np.asarray(poses)`, bit for bit.
- `Viewmats`: the renderer's world-to-camera matrices of the cameras asked for,
  `float32(inv(c2w[idx]))` computed per batch, the exact values the trainer's full float32
  tensor `float32(inv(c2w))[idx]` held (numpy inverts each 4x4 on its own, so the inverse of
  a subset equals the subset of the inverse). It holds no per-camera bytes of its own
  unless a pose is written into it (--pose_noise), which makes it dense as before.

scene.py imports it; it imports numpy (Viewmats imports torch when used, as scene.py does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import Tensor

_BOTTOM = np.array([0.0, 0.0, 0.0, 1.0])


class CameraPoses:
    """[C, 4, 4] float64 camera-to-world matrices stored as `rows` [C, 3, 4] float64 (the
    implied bottom row [0, 0, 0, 1]). Read-only: build a new Scene to change poses."""

    ndim = 3
    dtype = np.dtype(np.float64)

    def __init__(self, rows: np.ndarray):
        rows = np.asarray(rows)
        if rows.ndim != 3 or rows.shape[1:] != (3, 4) or rows.dtype != np.float64:
            raise ValueError(f"CameraPoses needs [C, 3, 4] float64 rows, got {rows.dtype} {rows.shape}")
        self.rows = rows  # [C, 3, 4]

    @property
    def shape(self) -> tuple:
        return (len(self.rows), 4, 4)

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes

    def __len__(self) -> int:
        return len(self.rows)

    def _full(self, first) -> np.ndarray:
        top = self.rows[first]  # [..., 3, 4]
        out = np.empty(top.shape[:-2] + (4, 4), np.float64)
        out[..., :3, :] = top
        out[..., 3, :] = _BOTTOM
        return out

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            return self._full(_np_index(key))
        if any(k is Ellipsis or k is None for k in key):
            return np.asarray(self)[key]
        first, rest = _np_index(key[0]), key[1:]
        if rest and _top_rows_only(rest[0]):  # e.g. [:, :3, 3] (centres): no [C, 4, 4] built
            top = self.rows[first]
            return top[(slice(None),) * (top.ndim - 2) + rest]
        full = self._full(first)
        return full[(slice(None),) * (full.ndim - 2) + rest]

    def __setitem__(self, key, value) -> None:
        raise TypeError("Scene.camtoworlds (CameraPoses) is read-only: build a new Scene with the changed poses")

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self._full(slice(None))
        return out if dtype is None else out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"CameraPoses({len(self)} cameras, [C, 3, 4] float64)"


def _np_index(key):
    """A torch index (tensor of camera indices) as numpy takes it."""
    return key.cpu().numpy() if type(key).__module__.startswith("torch") else key


def _top_rows_only(k) -> bool:
    if not isinstance(k, (int, np.integer, slice)):
        return False
    try:
        rows = range(4)[k]
    except IndexError:
        return False
    return rows < 3 if isinstance(rows, int) else (len(rows) == 0 or max(rows) < 3)


def compact_poses(camtoworlds: np.ndarray) -> Union[np.ndarray, CameraPoses]:
    """CameraPoses of float64 [C, 4, 4] poses whose bottom rows are exactly [0, 0, 0, 1]
    (every parser's, to the bit: +0.0, not -0.0), so that reading them back is exact; any
    other array (another dtype, a bottom row off by rounding) is returned as it is."""
    if isinstance(camtoworlds, CameraPoses):
        return camtoworlds
    a = camtoworlds
    if not isinstance(a, np.ndarray) or a.dtype != np.float64 or a.ndim != 3 or a.shape[1:] != (4, 4):
        return a
    bottom = a[:, 3, :]  # [C, 4]
    if not (np.array_equal(bottom, np.broadcast_to(_BOTTOM, bottom.shape)) and not np.signbit(bottom).any()):
        return a
    return CameraPoses(np.ascontiguousarray(a[:, :3, :]))


class Viewmats:
    """World-to-camera matrices [C_all, 4, 4] for the renderer, computed for the cameras
    indexed: `viewmats[idx]` is `inv(camtoworlds[idx])` rounded to float32 (the precision
    the trainer has always rendered with), then cast to `dtype`, on `device`. Quacks like
    the [C_all, 4, 4] tensor it replaces where the trainer and its tests use it: indexing,
    index assignment (makes it dense), .shape, .dtype, .device, .to/.double/.float/.cpu/.detach."""

    def __init__(self, camtoworlds: Union[np.ndarray, CameraPoses], dtype: Optional[torch.dtype] = None,
                 device: Optional[Union[str, torch.device]] = None, dense: Optional[Tensor] = None):
        import torch

        dtype = dtype or torch.float32
        self.camtoworlds = camtoworlds  # [C_all, 4, 4] float64 (an ndarray or CameraPoses), shared
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.dense = dense  # [C_all, 4, 4] once a pose was written into it (--pose_noise), else None

    @property
    def shape(self) -> torch.Size:
        import torch

        return torch.Size((len(self.camtoworlds), 4, 4))

    def __len__(self) -> int:
        return len(self.camtoworlds)

    def __getitem__(self, key) -> Tensor:
        import torch

        from ..transfer import to_device

        if self.dense is not None:
            if isinstance(key, torch.Tensor):  # no host stall
                key = to_device(key, self.dense.device)
            return self.dense[key]
        inv = np.linalg.inv(np.asarray(self.camtoworlds[_np_index(key)], dtype=np.float64))  # [..., 4, 4]
        out = torch.from_numpy(inv.astype(np.float32))  # round to nearest, as torch's cast
        if self.dtype != torch.float32:
            out = out.to(self.dtype)
        return to_device(out, self.device)  # pinned and queued on a CUDA stream: no host stall per step

    def __setitem__(self, key, value: Tensor) -> None:
        if self.dense is None:
            self.dense = self[:]
        self.dense[key] = value

    def to(self, *args, **kwargs) -> "Viewmats":
        import torch

        dtype, device = kwargs.get("dtype", self.dtype), kwargs.get("device", self.device)
        for a in args:
            if isinstance(a, torch.dtype):
                dtype = a
            else:
                device = torch.device(a)
        dense = None if self.dense is None else self.dense.to(dtype=dtype, device=device)
        return Viewmats(self.camtoworlds, dtype, device, dense)

    def double(self) -> "Viewmats":
        import torch

        return self.to(torch.float64)

    def float(self) -> "Viewmats":
        import torch

        return self.to(torch.float32)

    def cpu(self) -> "Viewmats":
        return self.to("cpu")

    def detach(self) -> "Viewmats":
        return self

    def held_nbytes(self) -> int:
        """Bytes this object holds of its own (the poses it reads are the scene's)."""
        return 0 if self.dense is None else self.dense.untyped_storage().nbytes()

    def __repr__(self) -> str:
        return f"Viewmats({len(self)} cameras, {self.dtype}, {self.device}, {'dense' if self.dense is not None else 'per batch'})"

