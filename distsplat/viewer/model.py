"""A finished model for the viewer (docs/design.md: checkpoints resume on any W; the PLY is the
standard 3DGS layout): each of W ranks loads only its contiguous chunk, from a checkpoint
(re-chunked through `read_meta` / `read_rows`), from gsplat's .pt files or from a PLY file (rows
read by offset: train/files/model_files.py),
so `examples/simple_viewer.py` runs on one process or under torchrun alike.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ..distributed import DistContext, all_reduce_sum, chunk_bounds
from ..train.files import checkpoint as ck
from ..train.files.model_files import is_gsplat_spec, is_ply_spec, open_model, read_ply_layout, read_ply_rows
from ..train.model.gaussians import activated

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    # Raw, this rank's rows: means [N, 3], scales [N, 3] (log), quats [N, 4],
    # opacities [N] (logit), sh0 [N, 1, 3], shN [N, K-1, 3]
    params: Dict[str, Tensor]
    n_all: int
    sh_degree: int
    render_kwargs: Dict[str, Any]  # the training run's render options, when known
    source: str
    step: int = 0  # the checkpoint's step (a PLY's: 0)

    def activated(self) -> Dict[str, Tensor]:
        return activated(self.params, self.sh_degree)


def _baked(meta: Dict[str, Any], cfg: Dict[str, Any], params: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """An --app_opt checkpoint's rows with SH colours: the appearance MLP (shard 0) at a
    zero embedding and zero direction, as the PLY export bakes them (app_opt.py)."""
    from ..train.model.app_opt import Appearance

    state = ck.load_shard(meta, 0).get("app_opt")
    if state is None:
        raise ck.CheckpointError(f"--ckpt {meta['dir']}: its Gaussians carry appearance features but shard 0 "
                                 "holds no appearance model (app_opt); view its PLY (R/ply/) instead")
    n_train, dim = state["embeds"].shape
    app = Appearance(n_train, torch.zeros(0, dtype=torch.int64), dim, int(cfg.get("sh_degree", 3)), 0.0, 0.0, 1,
                     0, torch.device("cpu"), state["embeds"].dtype)
    app.load_state_dict(state)
    return app.baked({k: v.to(state["embeds"].dtype) for k, v in params.items()})


def _sh_degree(k: int) -> int:
    d = int(round(math.sqrt(k))) - 1
    if (d + 1) ** 2 != k:
        raise ValueError(f"{k} SH coefficients per colour channel is not (degree + 1)^2")
    return d


def load_model(path: str, ctx: DistContext) -> LoadedModel:
    """This rank's chunk of the model at `path` (a 3DGS .ply file; gsplat's checkpoint .pt files,
    several joined by os.pathsep; or a checkpoint directory: R/ckpts/step_N or R/ckpts for the
    newest). Bad paths raise ValueError naming them."""
    p = Path(path)
    step = 0
    if is_ply_spec(path) or is_gsplat_spec(path):  # train/files/model_files.py: read by row range
        model = open_model(path, "--ckpt")
        start, end = chunk_bounds(model.n_all, ctx.world_size)[ctx.rank]
        params, n_all, step = model.rows(start, end), model.n_all, model.step
        kwargs: Dict[str, Any] = {}
        p = Path(model.describe()) if model.kind == "ply" else model.files[0]
    else:
        meta = ck.read_meta(p)  # CheckpointError (a ValueError) names the path
        n_all, step = int(meta["num_gaussians"]), int(meta["step"])
        start, end = chunk_bounds(n_all, ctx.world_size)[ctx.rank]
        params = ck.read_rows(meta, start, end)["params"]
        cfg = meta["state"].get("config", {})
        if "features" in params:  # --app_opt: colours baked as in the PLY (zero embedding, DC only)
            params = _baked(meta, cfg, params)
        kwargs = {k: cfg[k] for k in ("packed", "near_plane", "far_plane") if k in cfg}
        if cfg.get("antialiased"):
            kwargs["rasterize_mode"] = "antialiased"
        p = Path(meta["dir"])
    params = {k: v.to(ctx.device).float() for k, v in params.items()}
    sh_degree = _sh_degree(params["shN"].shape[1] + 1)
    return LoadedModel(params, n_all, sh_degree, kwargs, str(p), step)


def read_ply_header(path: Path) -> Tuple[int, list, int]:
    """(vertex count, property names, header bytes) of a binary 3DGS PLY (model_files.py)."""
    layout = read_ply_layout(Path(path))
    return layout.n, layout.names, layout.header_bytes


def read_ply_chunk(path: Path, rank: int, world_size: int) -> Tuple[Dict[str, Tensor], int]:
    """This rank's rows of a 3DGS PLY as raw parameters (the inverse of export.ply_rows)."""
    layout = read_ply_layout(Path(path))
    start, end = chunk_bounds(layout.n, world_size)[rank]
    return read_ply_rows(Path(path), start, end, layout=layout), layout.n


def model_view(means: Tensor) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(position, look_at, up) framing all Gaussians (centroid and spread of every rank's
    means, one all-reduce), z up as 3DGS scenes normalized by gsplat usually are."""
    m = means.detach().double()  # [N, 3]
    count = torch.tensor([float(len(m))], dtype=torch.float64, device=m.device)
    sums = torch.cat([m.sum(0), (m * m).sum(0), count])
    sums = all_reduce_sum(sums).cpu().numpy()  # [7]
    n = max(sums[6], 1.0)
    center = sums[:3] / n
    spread = math.sqrt(max(float((sums[3:6] / n - center**2).sum()), 1e-12))
    direction = np.array([1.0, 1.0, 0.6]) / np.linalg.norm([1.0, 1.0, 0.6])
    return center + 2.5 * spread * direction, center, np.array([0.0, 0.0, 1.0])


def training_view(source: str) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(position, look_at, up) of the first training camera of the run that wrote `source`
    (a checkpoint R/ckpts/step_N or a PLY R/ply/*.ply: R/cameras.json, train cameras first,
    issue 32), in the model's world: a checkpoint is normalised, a PLY in transform.json's
    ply_frame. None when the run left no cameras.json (a PLY from elsewhere)."""
    from ..data.normalize import transform_cameras
    from .camera import initial_view

    p = Path(source)
    is_ply = p.suffix.lower() == ".ply"
    for run in (p.parent.parent, p.parent):
        cams_file, frame_file = run / "cameras.json", run / "transform.json"
        if cams_file.is_file():
            break
    else:
        return None
    try:
        cams = json.loads(cams_file.read_text())
        frame = json.loads(frame_file.read_text()) if frame_file.is_file() else {}
        c2w = np.tile(np.eye(4), (len(cams), 1, 1))  # [C, 4, 4]
        c2w[:, :3, :3] = [c["rotation"] for c in cams]
        c2w[:, :3, 3] = [c["position"] for c in cams]
        if not is_ply and frame.get("cameras_frame") == "capture":  # the checkpoint's Gaussians are normalised
            c2w = transform_cameras(np.asarray(frame["normalized_from_capture"], dtype=np.float64), c2w)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        log.warning("%s: not readable as a 3DGS cameras.json (%s); the view starts from the model's extent",
                    cams_file, e)
        return None
    if len(c2w) == 0:
        return None
    return initial_view(c2w)
