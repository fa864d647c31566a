"""What a run leaves in its result dir, where gsplat users look for it:
stats/val_stepNNNN.json, stats/train_stepNNNN_rankR.json, ply/point_cloud_NNNN.ply (one
merged file, each rank writing its own rows), renders/, tb/ and cfg.yml."""

from __future__ import annotations

import logging
import os
import resource
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch
from torch import Tensor

from ...distributed import DistContext, barrier
from ..guards.shared_dir import nearest_existing
from .atomic import write_yaml
from .coords import write_transform
from .export import create_ply, ply_header, ply_rows, write_ply_rows

log = logging.getLogger(__name__)


def check_result_dir(result_dir: str) -> None:
    """ValueError unless --result_dir is a writable folder or can be created as one. Every
    rank writes there (its stats, checkpoint shards and PLY rows), so every rank checks,
    before the first collective; nothing is created, so a refused run leaves no trace."""
    existing = nearest_existing(result_dir)
    if not existing.is_dir():
        raise ValueError(f"--result_dir {result_dir}: {existing} is a file, not a folder; "
                         "pass a --result_dir whose parents are folders")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--result_dir {result_dir}: {existing} is not writable by this user; "
                         "pass a writable --result_dir or fix the folder's permissions")


def memory_gb(device: torch.device) -> float:
    """Peak device memory (CUDA) or peak resident memory of this process (CPU), in GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def export_ply(
    result_dir: Path, step: int, params: Dict[str, torch.Tensor], start: int, n_all: int,
    ctx: DistContext, guard: Optional[Any] = None,
) -> Optional[Path]:
    """One merged PLY: rank 0 sizes the file, every rank writes its rows at its offset,
    rank 0 renames it into place. Every rank calls this. With `guard` (save_guard.SaveGuard)
    a full disk on any rank skips the PLY on every rank (None returned, the partial file
    removed) instead of ending the run."""
    final = result_dir / "ply" / f"point_cloud_{step:04d}.ply"
    tmp = final.with_name(final.name + ".tmp")
    sh_rest = params["shN"].shape[1]
    rows = ply_rows(params)  # [N, F] float32
    header = len(ply_header(n_all, sh_rest))
    run = guard.run if guard is not None else _run_then_barrier
    what = f"PLY of step {step}"

    def create() -> None:
        final.parent.mkdir(parents=True, exist_ok=True)
        create_ply(tmp, n_all, sh_rest)

    ok = (run(what, lambda r: tmp, header, create if ctx.is_main else None)
          and run(what, lambda r: tmp, rows.nbytes, lambda: write_ply_rows(tmp, header, start, rows)))
    if not ok:
        guard.discard(tmp)
        return None
    if ctx.is_main:
        os.replace(tmp, final)
    return final


def _run_then_barrier(what, path_of, nbytes, write) -> bool:
    """SaveGuard.run without the guard: any error propagates."""
    if write is not None:
        write()
    barrier()
    return True


def save_image(path: Path, image: torch.Tensor) -> None:
    """[H, W, 3] float in [0, 1] -> PNG."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    arr = (image.detach().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    Image.fromarray(np.ascontiguousarray(arr)).save(path)


class TensorBoard:
    """Scalars and images in R/tb on rank 0; a no-op elsewhere, or when tensorboard is not installed."""

    def __init__(self, result_dir: Path, ctx: DistContext):
        self.writer: Optional[Any] = None
        if not ctx.is_main:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(result_dir / "tb"))
        except ImportError:
            log.info("tensorboard is not installed: no TensorBoard logs (pip install tensorboard)")

    def scalars(self, step: int, values: Dict[str, float]) -> None:
        if self.writer is not None:
            for k, v in values.items():
                self.writer.add_scalar(k, v, step)

    def image(self, tag: str, png: Path, step: int) -> None:
        """A PNG written by any rank (gsplat's side-by-side test renders)."""
        if self.writer is not None and png.is_file():
            from PIL import Image

            self.writer.add_image(tag, np.asarray(Image.open(png).convert("RGB")), step, dataformats="HWC")

    def train_images(self, step: int, gt: Tensor, render: Tensor) -> None:
        """--tb_save_image: this rank's training images of a step [C, H, W, 3] (rank 0's, as gsplat), ground
        truth | render side by side, stacked, as `train/render`."""
        if self.writer is not None and len(gt):
            canvas = torch.cat([gt, render.clamp(0, 1)], 2).detach().float().cpu()  # [C, H, 2W, 3]
            self.writer.add_image("train/render", canvas.reshape(-1, *canvas.shape[2:]).numpy(), step,
                                  dataformats="HWC")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def open_outputs(result_dir: Path, ctx: DistContext, cfg: Any, scene: Any) -> TensorBoard:
    """The first write into the result dir (only once setup succeeded on every rank): rank 0's
    resolved config (gsplat's cfg.yml; cfg_eval.yml without training) and, for training, the
    world of this run's PLYs (coords.py: transform.json; cameras.json comes with the first PLY)."""
    tb = TensorBoard(result_dir, ctx)
    if ctx.is_main:
        result_dir.mkdir(parents=True, exist_ok=True)
        name = "cfg.yml" if not (cfg.eval_only or cfg.render_only) else "cfg_eval.yml"
        write_yaml(result_dir / name, cfg.to_dict())  # the resolved config, as gsplat's cfg.yml
        if not (cfg.eval_only or cfg.render_only):
            write_transform(result_dir, scene, cfg.ply_frame)
    return tb
