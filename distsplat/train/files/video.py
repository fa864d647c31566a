"""--render_only: a camera path rendered with the distributed render (each rank renders
the frames it owns from its own chunk of the Gaussians; no rank gathers the model), each
frame RGB | depth side by side as PNG under R/videos/, then rank 0 writes them into an
MP4 with the ffmpeg that the imageio-ffmpeg wheel ships (a dependency: no system ffmpeg)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch
from torch import Tensor

from ...distributed import DistContext, barrier, chunk_bounds, distributed_rasterize
from .outputs import save_image
from .trajectory import camera_path

log = logging.getLogger(__name__)
_trainer_log = logging.getLogger("distsplat.train.trainer")  # render_path's summary line, as before the move


def depth_image(depth: Tensor, alpha: Tensor) -> Tensor:
    """[H, W] expected depth -> [H, W, 3] grey in [0, 1], near bright, normalised over this
    frame's covered pixels (as gsplat's videos: per frame min-max)."""
    covered = alpha > 0.5
    if not covered.any():
        return torch.zeros(*depth.shape, 3, device=depth.device)
    lo, hi = depth[covered].min(), depth[covered].max()
    d = 1.0 - ((depth - lo) / (hi - lo).clamp_min(1e-8)).clamp(0, 1)
    return (d * covered).unsqueeze(-1).expand(-1, -1, 3)


def render_path(cfg: Any, ctx: DistContext, camtoworlds: np.ndarray, render_args: Callable[[], Dict[str, Tensor]],
                K: Tensor, width: int, height: int, render_kwargs: Dict[str, Any], result_dir: Path,
                step: int, points: Optional[np.ndarray] = None) -> Dict[str, Any]:
    """--render_only: the camera path of --render_traj_path through the training cameras
    `camtoworlds` [C_train, 4, 4] (`points` [P, 3]: the scene's, for a spiral's focus), as PNG
    frames (RGB | depth) and an MP4 in R/videos/, seen through `K` [3, 3] at width x height;
    returns the trainer's metrics of it."""
    c2w = camera_path(cfg.render_traj_path, camtoworlds, cfg.render_traj_frames, points)
    viewmats = torch.from_numpy(np.linalg.inv(c2w)).float().to(ctx.device)  # [F, 4, 4]
    frames = Path(result_dir) / "videos" / f"traj_{cfg.render_traj_path}_step{step:04d}"
    n = render_frames(render_args, viewmats, K, width, height, ctx, cfg.sh_degree, render_kwargs, frames)
    mp4 = write_mp4(frames, n, frames.with_suffix(".mp4"), cfg.render_fps) if ctx.is_main else None
    if ctx.is_main:
        _trainer_log.info("rendered %d frames (RGB | depth) to %s%s", n, frames, f" and {mp4}" if mp4 else "")
    return dict(frames=n, frames_dir=str(frames), video=str(mp4) if mp4 else None)


@torch.no_grad()
def render_frames(
    render_args: Callable[[], Dict[str, Tensor]],  # the activated Gaussians (local chunk)
    viewmats: Tensor,  # [F, 4, 4] the whole path
    K: Tensor,  # [3, 3]
    width: int,
    height: int,
    ctx: DistContext,
    sh_degree: int,
    render_kwargs: Dict,  # may hold sh_degree / pair_colors (--app_opt), which win
    frames_dir: Path,
) -> int:
    """Every rank renders its contiguous share of the frames (one per rank per round, like
    the evaluation) and writes them as frames_dir/NNNNN.png. Every rank calls this."""
    n = viewmats.shape[0]
    bounds = chunk_bounds(n, ctx.world_size)
    rounds = max(end - start for start, end in bounds)
    progress = None
    if ctx.is_main:
        from tqdm import tqdm

        progress = tqdm(total=n, desc="render", unit="frame", dynamic_ncols=True, disable=not sys.stderr.isatty())
    g = render_args()
    kwargs = {**render_kwargs, "render_mode": "RGB+ED"}
    for j in range(rounds):
        pos = [start + j for start, end in bounds if start + j < end]
        owner = [r for r, (start, end) in enumerate(bounds) if start + j < end]
        colors, alphas, _ = distributed_rasterize(
            g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
            viewmats[pos], K.expand(len(pos), 3, 3), width, height,
            owner, **{"sh_degree": sh_degree, **kwargs},  # host ints: no device copy
        )
        if ctx.rank in owner:
            p = pos[owner.index(ctx.rank)]
            rgb = colors[0, ..., :3].clamp(0, 1)
            depth = depth_image(colors[0, ..., 3], alphas[0, ..., 0])
            save_image(frames_dir / f"{p:05d}.png", torch.cat([rgb, depth], 1))
        if progress is not None:
            progress.update(len(pos))
    if progress is not None:
        progress.close()
    barrier()  # every frame is on disk before rank 0 reads them
    return n


def write_mp4(frames_dir: Path, n: int, path: Path, fps: int) -> Optional[Path]:
    """The PNG frames 00000..n-1 as an H.264 MP4 (odd sizes padded by one pixel: yuv420p
    needs even ones). None, with one log line, when ffmpeg is missing or fails: the frames
    are the result, the MP4 a convenience that never fails the run."""
    try:
        import imageio_ffmpeg
    except ImportError:  # a dependency; absent only where it was installed without (pip --no-deps)
        log.warning("no MP4: imageio-ffmpeg is not installed (pip install imageio-ffmpeg); the frames are in %s",
                    frames_dir)
        return None
    from PIL import Image

    first = np.asarray(Image.open(frames_dir / "00000.png").convert("RGB"))
    h, w = first.shape[:2]
    H, W = h + h % 2, w + w % 2
    tmp = path.with_name(path.stem + ".tmp.mp4")
    try:
        writer = imageio_ffmpeg.write_frames(str(tmp), (W, H), fps=fps, macro_block_size=1, quality=8,
                                             output_params=["-loglevel", "error"])
        writer.send(None)
        for i in range(n):
            frame = np.asarray(Image.open(frames_dir / f"{i:05d}.png").convert("RGB"))
            frame = np.pad(frame, ((0, H - h), (0, W - w), (0, 0)), mode="edge")
            writer.send(np.ascontiguousarray(frame))
        writer.close()
        tmp.replace(path)
    except (RuntimeError, OSError) as e:  # no ffmpeg binary for this platform, ffmpeg crashed, a full disk
        tmp.unlink(missing_ok=True)
        why = (str(e).strip().splitlines() or [""])[-1][:200]  # ffmpeg's own last line says most
        log.warning("no MP4: ffmpeg failed (%s: %s); the frames are in %s", type(e).__name__, why, frames_dir)
        return None
    return path
