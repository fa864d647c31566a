"""One copy of the camera poses per rank (issue 20: a million images, <= 200 MB per rank
besides the image cache). Every rank holds every camera's pose (docs/design.md); at a million
cameras the scene's float64 camera-to-world matrices [C, 4, 4] are 122 MiB, and a float32
world-to-camera copy of them for the renderer would be another 61 MiB. Here `CameraPoses`:
the scene's camera-to-world matrices held as their top three rows [C, 3, 4] float64 (the
bottom row of a rigid or similarity pose is [0, 0, 0, 1]; 92 MiB at a million cameras). It
reads as the [C, 4, 4] float64 array it replaces: `poses[i]`, `poses[idx]`, `poses[:, :3, 3]`,
`len`, `.shape`, `np.asarray(poses)`, bit for bit. The renderer's world-to-camera matrices
are no second copy: `Scene.viewmats(idx, device)` inverts the cameras of each batch.

scene.py imports it; it imports numpy only.
"""

from __future__ import annotations

from typing import Union

import numpy as np

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

