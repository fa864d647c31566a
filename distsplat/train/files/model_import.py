"""A run seeded by another trainer's model (issue 46, point 2): `--ckpt` of gsplat's `.pt` files
(one, a list, or its distributed mode's per-rank files) or of a 3DGS PLY, for --eval_only and
--render_only and, for gsplat's files, to go on training from their step on any number of
ranks; and `--init_type ply --init_ply F` (a PLY or gsplat's .pt files) as the initial
Gaussians of a run from step 0.

Each rank reads only its chunk of the model's global rows (model_files.py), so no rank holds
the whole model; the rows are the file's, in its order (a gsplat list in the list's order, as
gsplat concatenates it). What such a file lacks starts fresh, as it would in gsplat: Adam's
moments, densification statistics, the batch sequence (from its start), the learning-rate
scaling (measured when training starts), Gaussian ids (their global order now).

Worlds: the run trains in its scene's normalised world (data/normalize.py, the same as
gsplat's parser). A model in the capture's own world (COLMAP's: the original 3DGS
implementation's PLYs) is moved into it exactly (coords.py's similarity, SH rotated).
`--model_frame auto` takes a distsplat run's PLY in the world its transform.json names,
gsplat's .pt and a gsplat run's PLY (a cfg.yml beside) in the normalised one, any other PLY
in the capture's; rank 0 says which, and `--model_frame normalized|capture` overrides it."""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ...distributed import DistContext, chunk_bounds
from .checkpointer import ModelRows, Resumed
from .coords import CAPTURE, NORMALIZED, to_capture
from .model_files import ModelFile, fit_sh, is_gsplat_spec, is_ply_spec, open_model

log = logging.getLogger("distsplat.train.trainer")  # the trainer's log lines


def is_model_file(spec: Optional[str]) -> bool:
    """Whether a --ckpt value is another trainer's model (gsplat .pt files or a PLY), not a
    distsplat checkpoint directory."""
    return is_gsplat_spec(spec) or is_ply_spec(spec)


def model_frame(model: ModelFile, requested: str) -> Tuple[str, str]:
    """(normalized or capture, why) of `model`'s world (module doc)."""
    if requested != "auto":
        return requested, f"--model_frame {requested}"
    if model.kind == "gsplat":
        return NORMALIZED, "gsplat's .pt: gsplat trains in the normalised world, as distsplat"
    path = model.files[0]
    for run in (path.parent.parent, path.parent):
        frame_file, cfg_file = run / "transform.json", run / "cfg.yml"
        if frame_file.is_file():
            try:
                frame = json.loads(frame_file.read_text())["ply_frame"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if frame in (NORMALIZED, CAPTURE):
                return frame, f"the distsplat run's {frame_file} says its PLYs are in the {frame} world"
        if cfg_file.is_file():
            text = cfg_file.read_text(errors="replace")
            if re.search(r"^normalize_world_space:\s*false", text, re.M):
                return CAPTURE, f"{cfg_file} trained without --normalize_world_space"
            return NORMALIZED, f"{cfg_file} beside it: a gsplat run's PLY, in gsplat's normalised world"
    return CAPTURE, "a PLY from elsewhere: in the capture's world, as the original 3DGS implementation writes it"


def from_capture(params: Dict[str, Tensor], transform: np.ndarray) -> Dict[str, Tensor]:
    """Raw Gaussians from the capture's world into the normalised one (normalized = T @
    capture): coords.to_capture with the inverse similarity."""
    return to_capture(params, np.linalg.inv(np.asarray(transform, dtype=np.float64)))


def rank_rows(cfg: Any, ctx: DistContext, transform: np.ndarray, spec: str, flag: str
              ) -> Tuple[ModelFile, Tuple[int, int], Dict[str, Tensor], str]:
    """(the model, this rank's [start, end) of its rows, those rows as raw float32 parameters in
    the run's world with the run's SH degree, a line for the log)."""
    model = open_model(spec, flag)
    what = f"{flag} {model.describe()}"
    if cfg.app_opt:
        raise ValueError(f"{what} holds SH colours, and --app_opt trains appearance features instead; drop "
                         "--app_opt to use this model")
    bounds = chunk_bounds(model.n_all, ctx.world_size)[ctx.rank]
    params = model.rows(*bounds)
    params, sh_note = fit_sh(params, cfg.sh_degree, what)
    frame, why = model_frame(model, cfg.model_frame)
    if frame == CAPTURE and not np.allclose(transform, np.eye(4)):
        params = from_capture(params, transform)
    line = (f"{what}: {model.n_all} Gaussians{f' of step {model.step}' if model.kind == 'gsplat' else ''}, "
            f"in the {frame} world ({why}){'; ' + sh_note if sh_note else ''}")
    return model, bounds, params, line


def import_checkpoint(cfg: Any, ctx: DistContext, transform: np.ndarray, spec: str, rows: ModelRows) -> Resumed:
    """--ckpt of gsplat's .pt files or a PLY: this rank's chunk of the model as the run's
    Gaussians (`rows`: the trainer's, loaded in place), at the files' step (a PLY: step 0, for
    --eval_only / --render_only only); `transform`: the scene's normalisation."""
    model, bounds, params, line = rank_rows(cfg, ctx, transform, spec, "--ckpt")  # (a PLY: validate's)
    rows.load_state_dict({"params": params, "optim": {}, "per_gaussian": {}, "bounds": bounds})  # fresh ids
    if ctx.is_main:
        log.info("%s", line)
        if model.kind == "gsplat" and not (cfg.eval_only or cfg.render_only):
            log.info("training on from gsplat's step %d (gsplat's trainer evaluates --ckpt files; --eval_only "
                     "does that here): fresh Adam moments, densification statistics and batch sequence, as "
                     "gsplat's checkpoints hold none", model.step)
    return Resumed(model.step, model.n_all, model.describe())


def initial_params(cfg: Any, ctx: DistContext, device: torch.device, transform: np.ndarray
                   ) -> Tuple[torch.nn.ParameterDict, int]:
    """--init_type ply: this rank's chunk of --init_ply's model as the initial Gaussians (raw
    parameters, in the run's world and SH degree) and the model's Gaussian count."""
    model, _, params, line = rank_rows(cfg, ctx, transform, cfg.init_ply, "--init_ply")
    if ctx.is_main:
        log.info("init: %s", line)
    return torch.nn.ParameterDict({k: torch.nn.Parameter(v.to(device)) for k, v in params.items()}), model.n_all


def check_model_flags(cfg: Any) -> None:
    """ValueError for --ckpt / --init_ply combinations that cannot work (Config.validate's)."""
    if cfg.init_ply is not None and cfg.init_type not in ("auto", "ply"):
        raise ValueError(f"--init_ply {cfg.init_ply} is the initial model of --init_type ply, and --init_type is "
                         f"{cfg.init_type}: pass --init_type ply (or drop --init_ply)")
    if cfg.init_type == "ply" and cfg.init_ply is None:
        raise ValueError("--init_type ply starts from a model file: pass it with --init_ply F (a 3DGS PLY or "
                         "gsplat's .pt files)")
    if cfg.init_ply is not None and not is_model_file(cfg.init_ply):
        raise ValueError(f"--init_ply {cfg.init_ply}: expected a 3DGS PLY (.ply) or gsplat's checkpoint files "
                         "(.pt); a distsplat checkpoint resumes with --ckpt")
    if cfg.init_ply is not None and cfg.ckpt is not None:
        raise ValueError(f"--init_ply {cfg.init_ply} and --ckpt {cfg.ckpt} both give the model: pass one "
                         "(--ckpt goes on from a checkpoint's step, --init_ply starts a run from step 0)")
    if is_ply_spec(cfg.ckpt) and not (cfg.eval_only or cfg.render_only):
        raise ValueError(f"--ckpt {cfg.ckpt}: a PLY holds no training step or optimizer state to resume; to "
                         f"train from it pass --init_type ply --init_ply {cfg.ckpt} (a run from step 0), or "
                         "--eval_only / --render_only to score or render it")
