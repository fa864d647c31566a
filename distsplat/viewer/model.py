"""A finished model for the viewer (docs/design.md: checkpoints resume on any W; the PLY is the
standard 3DGS layout): each of W ranks loads only its contiguous chunk, from a checkpoint
(re-chunked through `read_meta` / `read_rows`) or from a PLY file (rows read by offset),
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
from ..train import checkpoint as ck
from ..train.export import ply_fields
from ..train.gaussians import activated

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

    def activated(self) -> Dict[str, Tensor]:
        return activated(self.params, self.sh_degree)


def _baked(meta: Dict[str, Any], cfg: Dict[str, Any], params: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """An --app_opt checkpoint's rows with SH colours: the appearance MLP (shard 0) at a
    zero embedding and zero direction, as the PLY export bakes them (app_opt.py)."""
    from ..train.app_opt import Appearance

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
    """This rank's chunk of the model at `path` (a .ply file, or a checkpoint directory:
    R/ckpts/step_N or R/ckpts for the newest). Bad paths raise ValueError naming them."""
    p = Path(path)
    if p.suffix.lower() == ".ply":
        if not p.is_file():
            raise ValueError(f"--ckpt {p}: no such PLY file")
        params, n_all = read_ply_chunk(p, ctx.rank, ctx.world_size)
        kwargs: Dict[str, Any] = {}
    else:
        meta = ck.read_meta(p)  # CheckpointError (a ValueError) names the path
        n_all = int(meta["num_gaussians"])
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
    return LoadedModel(params, n_all, sh_degree, kwargs, str(p))


def read_ply_header(path: Path) -> Tuple[int, list, int]:
    """(vertex count, property names, header bytes) of a binary little-endian float PLY."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    end = head.find(b"end_header\n")
    if not head.startswith(b"ply\n") or end < 0:
        raise ValueError(f"--ckpt {path}: not a PLY file")
    n, names = None, []
    for line in head[:end].decode("ascii", "replace").splitlines()[1:]:
        parts = line.split()
        if parts[:1] in (["format"], ["element"], ["property"]) and len(parts) < 3:
            raise ValueError(f"--ckpt {path}: malformed PLY header line {line!r}")
        if parts[:1] == ["format"] and parts[1:2] != ["binary_little_endian"]:
            raise ValueError(f"--ckpt {path}: PLY format {parts[1]} is not supported "
                             "(binary_little_endian only)")
        if parts[:2] == ["element", "vertex"]:
            if not parts[2].isdigit():
                raise ValueError(f"--ckpt {path}: PLY vertex count {parts[2]!r} is not a number")
            n = int(parts[2])
        elif parts[:1] == ["element"]:
            raise ValueError(f"--ckpt {path}: unexpected PLY element {parts[1]!r}")
        elif parts[:1] == ["property"]:
            if parts[1] != "float":
                raise ValueError(f"--ckpt {path}: PLY property {parts[-1]} is {parts[1]}, expected float")
            names.append(parts[2])
    if n is None:
        raise ValueError(f"--ckpt {path}: PLY has no vertex element")
    return n, names, end + len(b"end_header\n")


def read_ply_chunk(path: Path, rank: int, world_size: int) -> Tuple[Dict[str, Tensor], int]:
    """This rank's rows of a 3DGS PLY as raw parameters (the inverse of export.ply_rows)."""
    n_all, names, header = read_ply_header(path)
    n_rest = sum(name.startswith("f_rest_") for name in names)
    if n_rest % 3 or names != ply_fields(n_rest // 3):
        raise ValueError(f"--ckpt {path}: PLY properties are not the 3DGS layout "
                         "(x y z nx ny nz f_dc_* f_rest_* opacity scale_* rot_*)")
    F = len(names)
    size = path.stat().st_size
    if size < header + n_all * F * 4:  # before reading: the header's count must match the file
        raise ValueError(f"--ckpt {path}: the PLY header announces {n_all} Gaussians ({n_all * F * 4} bytes), the "
                         f"file holds {max(size - header, 0)} bytes after its header: truncated or damaged")
    start, end = chunk_bounds(n_all, world_size)[rank]
    rows = np.fromfile(path, dtype="<f4", count=(end - start) * F, offset=header + start * F * 4)
    rows = torch.from_numpy(rows.reshape(end - start, F).copy())  # [N, F]
    col = {name: i for i, name in enumerate(names)}
    k1 = n_rest // 3
    rest = rows[:, col["f_dc_2"] + 1: col["f_dc_2"] + 1 + n_rest]
    params = {
        "means": rows[:, 0:3],
        "sh0": rows[:, col["f_dc_0"]: col["f_dc_0"] + 3].reshape(-1, 1, 3),
        "shN": rest.reshape(len(rows), 3, k1).transpose(1, 2).contiguous(),  # channel-major on disk
        "opacities": rows[:, col["opacity"]],
        "scales": rows[:, col["scale_0"]: col["scale_0"] + 3],
        "quats": rows[:, col["rot_0"]: col["rot_0"] + 4],
    }
    return params, n_all


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
