"""Mixed image sizes in one scene: a step's global batch rendered as one
`distributed_rasterize` call per image size (issue 16).

`distributed_rasterize` takes one width/height per call, identical on every rank. Every
rank knows the whole batch (the shared-seed batcher) and every camera's size (the scene),
so every rank splits the batch into the same size groups, ordered by (height, width), and
makes the same calls in the same order: no collective is added and none can be missed.
Within a group the cameras keep their batch order, so the owners stay non-decreasing and
each rank's own images of the group are its own images of the batch in batch order.

Why groups and not padding to the largest size with a mask: a padded pixel costs its
rasterization, its loss and its SSIM blur in both directions, and SSIM's zero padding at a
mask's edge would need the mask carried into every window to weigh an image as its own
size does; a group costs one more count exchange and payload all-to-all per extra size
(benchmarks/results/archive/mixed_sizes_cpu2_2026-11-23.json measured both against a single-size
scene of the same pixels, with the one-off study bench_mixed_sizes.py, since removed).

The loss needs nothing special: each image's loss is its own mean, divided by the global
batch C, whatever call rendered it, so the sum over the groups is the single-size loss.
Densification does: gsplat's DefaultStrategy turns means2d.grad into [-1, 1] screen units
with ONE (width, height, n_cameras) per render, `grad[..., 0] *= width / 2 * n_cameras`,
and radii with `radii / max(width, height)`. `merge_meta` presents the groups' metas as one
render of the first group's size with n_cameras = C (the global batch, which every group's
loss is divided by): group g's gradients are pre-scaled by (W_g / W_0, H_g / H_0) and its
radii by max(W_0, H_0) / max(W_g, H_g), so gsplat's one normalization gives each pair the
one its own size would (exactly 1 for a single size: that path is not touched at all).
MCMC reads nothing from the render."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ...data.loader import Batch
from ...transfer import to_device


@dataclass(frozen=True)
class SizeGroup:
    """The batch cameras of one image size."""

    width: int
    height: int
    positions: Tensor  # [C_g] int64 batch positions, ascending
    own: List[int]  # indices into this rank's own cameras of the batch (batch order) that are in the group
    whole: bool  # the group is the whole batch (a single-size batch): select() returns its input
    owner: Tuple[int, ...] = ()  # [C_g] owner rank of each camera of the group (host ints)
    _on: Dict[torch.device, Tensor] = field(default_factory=dict, compare=False, repr=False)

    def positions_on(self, device: torch.device) -> Tensor:
        """`positions` on `device`, copied once per step and device (pinned and queued on CUDA:
        no host sync)."""
        if device not in self._on:
            self._on[device] = to_device(self.positions, device)
        return self._on[device]

    def select(self, x: Optional[Tensor]) -> Optional[Tensor]:
        """Rows of a per-batch-camera tensor [C, ...] -> [C_g, ...] (None stays None)."""
        if x is None or self.whole:
            return x
        return x[self.positions_on(x.device)]


def size_groups(
    widths: Sequence[int],  # [C] width of each batch camera
    heights: Sequence[int],  # [C]
    camera_owner: Sequence[int],  # [C] owner rank of each batch camera
    rank: int,
) -> List[SizeGroup]:
    """The batch split by image size, ordered by (height, width): the same list on every
    rank (a pure function of the batch). One size gives one group flagged `whole`."""
    w = np.asarray(widths, dtype=np.int64).reshape(-1)
    h = np.asarray(heights, dtype=np.int64).reshape(-1)
    owner = np.asarray(camera_owner, dtype=np.int64).reshape(-1)
    if not len(w) == len(h) == len(owner):
        raise ValueError(f"size_groups: widths {len(w)}, heights {len(h)} and camera_owner {len(owner)} "
                         "must all have one entry per batch camera")
    own_rank = np.cumsum(owner == rank) - 1  # [C] index of a camera among this rank's own ones
    sizes = sorted({(int(hh), int(ww)) for ww, hh in zip(w, h)})
    groups = []
    for hh, ww in sizes:
        pos = np.nonzero((w == ww) & (h == hh))[0]
        own = [int(own_rank[p]) for p in pos if owner[p] == rank]
        groups.append(SizeGroup(ww, hh, torch.from_numpy(pos), own, whole=len(sizes) == 1,
                                owner=tuple(owner[pos].tolist())))
    return groups


def group_images(batch: Batch, group: SizeGroup) -> Tensor:
    """This rank's own images of the group [C_own_g, H_g, W_g, 3] uint8, from the loader's
    batch of its own images (batch order); a single-size batch's is its stacked view (no copy)."""
    if group.whole:
        return batch.stacked()
    if not group.own:
        return torch.empty((0, group.height, group.width, 3), dtype=torch.uint8,
                           device=batch.images[0].device if batch.images else None)
    return torch.stack([batch.images[j] for j in group.own])


def group_cameras(batch: Batch, group: SizeGroup) -> List[int]:
    """The scene indices of this rank's own cameras of the group, in batch order."""
    return [batch.cameras[j] for j in group.own]


class MergedMeans2d:
    """Stands in for meta["means2d"] of one render covering every group: `.grad` and
    `.absgrad` (read after backward) are the groups' ones, each rescaled to the reference
    size, concatenated along the first dim ([M, 2] packed, [C, N, 2] dense)."""

    def __init__(self, parts: List[Tensor], scales: List[Tuple[float, float]]):
        self.parts, self.scales = parts, scales

    def retain_grad(self) -> None:
        for p in self.parts:
            if p.requires_grad:
                p.retain_grad()

    def _merged(self, attr: str) -> Tensor:
        out = []
        for p, (sx, sy) in zip(self.parts, self.scales):
            g = getattr(p, attr, None)
            g = torch.zeros_like(p) if g is None else g
            out.append(g * g.new_tensor([sx, sy]))
        return torch.cat(out)

    @property
    def grad(self) -> Tensor:
        return self._merged("grad")

    @property
    def absgrad(self) -> Tensor:
        return self._merged("absgrad")


def merge_meta(metas: List[Dict[str, Any]], groups: List[SizeGroup], n_cameras: int) -> Dict[str, Any]:
    """The groups' render metas as the one a densification strategy reads (see the module
    doc); a single group's meta is returned as it is. n_cameras: the global batch C."""
    if len(metas) == 1:
        return metas[0]
    W0, H0 = groups[0].width, groups[0].height
    scales = [(g.width / W0, g.height / H0) for g in groups]
    radius_scale = [max(W0, H0) / max(g.width, g.height) for g in groups]
    packed = metas[0]["packed"]
    cat = lambda key: torch.cat([m[key] for m in metas])  # noqa: E731
    merged: Dict[str, Any] = {
        "means2d": MergedMeans2d([m["means2d"] for m in metas], scales),
        # float: a radius in the reference size's pixels is not an integer
        "radii": torch.cat([m["radii"].float() * s for m, s in zip(metas, radius_scale)]),
        "gaussian_ids": cat("gaussian_ids") if packed else None,
        # batch positions: each group's camera ids index its own call's cameras
        "camera_ids": torch.cat([g.positions_on(m["camera_ids"].device)[m["camera_ids"]]
                                 for m, g in zip(metas, groups)]) if packed else None,
        "width": W0, "height": H0, "n_cameras": n_cameras, "packed": packed,
        "groups": metas,
    }
    return merged


def image_sizes(widths: np.ndarray, heights: np.ndarray) -> List[Tuple[int, int]]:
    """The scene's distinct (width, height), sorted (numpy: no object per camera)."""
    wh = np.unique(np.stack([widths, heights], 1), axis=0)  # [S, 2]
    return [(int(w), int(h)) for w, h in wh.tolist()]
