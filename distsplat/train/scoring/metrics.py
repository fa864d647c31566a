"""What an evaluation leaves behind (rank 0, after the ranks' scores are summed):
stats/val_stepNNNN.json (the means, gsplat's keys), stats/val_stepNNNN.csv (one row per test
image, so a user sees which views are bad), the log line and TensorBoard's scalars and
side-by-side renders (read back from renders/, where their owners wrote them)."""

from __future__ import annotations

import csv
import logging
import math
import os
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Optional, Sequence

import numpy as np

from ..files.atomic import write_json
from ..files.outputs import TensorBoard

log = logging.getLogger(__name__)

METRICS = ("psnr", "ssim", "lpips")  # rows of the per-image score matrix
CC_METRICS = ("cc_psnr", "cc_ssim", "cc_lpips")  # with a bilateral grid: after color_correct.py's fit, as gsplat


def render_stem(name: str) -> str:
    """A test image's name as render files and TensorBoard tags show it: without its
    extension (the file is a PNG whatever the image was), without a leading images/ or
    images_N/ folder (nerfstudio names carry it, COLMAP names are inside it, so both loaders
    give one name), its subfolders joined by "_" (renders/ stays one flat folder):
    images/robot/000.jpg -> robot_000."""
    parts = PurePosixPath(name.replace("\\", "/")).with_suffix("").parts
    if len(parts) > 1 and (parts[0] == "images" or (parts[0].startswith("images_") and parts[0][7:].isdigit())):
        parts = parts[1:]
    return "_".join(p for p in parts if p not in ("", ".", ".."))


def render_name(renders_dir: Path, step: int, name: str) -> Path:
    """The side-by-side PNG of one test image, ground truth left, render right, as its name
    says: image `images/input_0001.jpg` at step 300 -> val_step0300_input_0001_gt-vs-render.png."""
    return renders_dir / f"val_step{step:04d}_{render_stem(name)}_gt-vs-render.png"


def write_per_image_csv(path: Path, names: Sequence[str], per_image: Dict[str, np.ndarray]) -> None:
    """name, psnr, ssim, lpips (and cc_psnr, cc_ssim, cc_lpips with a bilateral grid) per test
    image (lpips empty when skipped); atomic."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    columns = [k for k in METRICS + CC_METRICS if k in per_image]
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", *columns])
        for i, name in enumerate(names):
            w.writerow([name, *("" if math.isnan(v) else f"{v:.6f}" for v in (per_image[k][i] for k in columns))])
    os.replace(tmp, path)


def report_eval(result_dir: Path, step: int, stats: Dict[str, Any], per_image: Dict[str, np.ndarray],
                names: Sequence[str], lpips_note: Optional[str], tb: Optional[TensorBoard],
                num_renders: int) -> Dict[str, Any]:
    """Writes the JSON, CSV, log line and TensorBoard entries of one evaluation; returns the
    JSON's content. lpips_note: why LPIPS was skipped (None when it was computed)."""
    stats = dict(stats)
    if lpips_note is not None or math.isnan(stats.get("lpips", math.nan)):
        stats["lpips"] = None  # JSON has no NaN
        stats["lpips_skipped"] = lpips_note or "LPIPS skipped"
        if "cc_lpips" in stats:
            stats["cc_lpips"] = None
    write_json(result_dir / "stats" / f"val_step{step:04d}.json", stats)
    if per_image:
        write_per_image_csv(result_dir / "stats" / f"val_step{step:04d}.csv", names, per_image)
    if "psnr" not in stats:
        return stats
    lp = "" if stats["lpips"] is None else f", LPIPS {stats['lpips']:.4f}"
    if "cc_psnr" in stats:  # gsplat's line with a bilateral grid
        lp += f"; CC_PSNR {stats['cc_psnr']:.3f}, CC_SSIM {stats['cc_ssim']:.4f}" + (
            "" if stats["cc_lpips"] is None else f", CC_LPIPS {stats['cc_lpips']:.4f}")
    log.info("step %d: PSNR %.3f, SSIM %.4f%s, %s Gaussians", step, stats["psnr"], stats["ssim"], lp,
             stats.get("num_GS"))
    if tb is not None:
        tb.scalars(step, {f"val/{k}": stats[k] for k in METRICS + CC_METRICS if stats.get(k) is not None})
        for name in names[:num_renders]:  # their owners wrote them before the scores' all-reduce
            tb.image(f"val/{render_stem(name)}", render_name(result_dir / "renders", step, name), step)
    return stats
