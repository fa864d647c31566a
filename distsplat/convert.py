"""A model into gsplat's checkpoint format or the 3DGS PLY (issue 46, point 2), so gsplat's
viewer and tools open distsplat's models and distsplat's open theirs:

    python -m distsplat.convert R/ckpts R/gsplat                   # -> R/gsplat/ckpt_30000_rank0.pt
    torchrun --nproc_per_node=4 -m distsplat.convert R/ckpts R/gsplat   # one file per rank, as gsplat's
                                                                   # distributed mode writes them
    python -m distsplat.convert R/gsplat/ckpt_29999_rank0.pt model.ply --to ply

The source is a distsplat checkpoint (R/ckpts/step_N, or R/ckpts for the newest), gsplat's .pt
files (a distributed run's other ranks' files beside the one given come too) or a 3DGS PLY; each
rank reads only its chunk (viewer/model.py's load_model) and writes it: gsplat's layout (one
`ckpt_{step}_rank{r}.pt` per rank, which gsplat's `--ckpt` concatenates in rank order, the
global order) or its rows of one merged PLY. --app_opt checkpoints get their colours baked into
the DC term, as distsplat's and gsplat's PLYs. The model stays in its world (the normalised one
for a checkpoint or gsplat's files; R/transform.json maps it to the capture's).

The distsplat package's entry point beside the trainer's (composition root: it reads models
through the viewer's loader)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Sequence

from tyro.conf import Positional

from .cli import exit_bad_input
from .distributed import DistContext, barrier, destroy, gather_counts, init_distributed, raise_together, setup_logging
from .train.files.export import create_ply, ply_header, ply_rows, write_ply_rows
from .train.files.model_files import gsplat_name, write_gsplat_pt
from .viewer.model import load_model


@dataclass
class Args:
    src: Positional[str]
    """The model: a distsplat checkpoint (R/ckpts/step_N, or R/ckpts for the newest), gsplat's .pt file(s)
    (joined by the path separator, ':'), or a 3DGS PLY."""
    out: Positional[str]
    """Where to write it: a folder for gsplat's files (ckpt_STEP_rankR.pt inside), or a .pt file on one process;
    a .ply file for --to ply."""
    to: Literal["gsplat", "ply"] = "gsplat"
    """gsplat: gsplat 1.5.3's checkpoint {"step", "splats"} (its trainer's --ckpt, simple_viewer.py, its
    compression); ply: the standard 3DGS PLY."""


def convert(ctx: DistContext, args: Args) -> Path:
    """Every rank writes its chunk of the model; returns what this rank wrote (the merged PLY for
    --to ply). Bad input raises the same ValueError on every rank, before anything is written."""
    error, model = None, None
    try:
        if args.to == "ply" and not args.out.lower().endswith(".ply"):
            raise ValueError(f"--out {args.out}: --to ply writes one PLY file: pass a path ending in .ply")
        model = load_model(args.src, ctx)
    except Exception as e:  # noqa: BLE001 - every rank must reach the agreement
        error = e
    raise_together(ctx, error, "loading the model")  # one line, rank 0's, on a bad input
    out = Path(args.out)
    if args.to == "gsplat":
        path = out if out.suffix == ".pt" and ctx.world_size == 1 else out / gsplat_name(model.step, ctx.rank)
        write_gsplat_pt(path, model.params, model.step)
        barrier()
        if ctx.is_main:
            shown = path if ctx.world_size == 1 else out / f"ckpt_{model.step}_rank*.pt"
            print(f"{model.source} ({model.n_all} Gaussians, step {model.step}) -> {shown} (gsplat's layout)")
        return path
    counts = gather_counts(len(model.params["means"]), ctx.device)
    rows = ply_rows(model.params)
    sh_rest = model.params["shN"].shape[1]
    tmp = out.with_name(out.name + ".tmp")
    if ctx.is_main:
        out.parent.mkdir(parents=True, exist_ok=True)
        create_ply(tmp, model.n_all, sh_rest)
    barrier()
    write_ply_rows(tmp, len(ply_header(model.n_all, sh_rest)), sum(counts[: ctx.rank]), rows)
    barrier()
    if ctx.is_main:
        os.replace(tmp, out)
        print(f"{model.source} ({model.n_all} Gaussians) -> {out}")
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    import tyro

    args = tyro.cli(Args, args=argv)
    ctx = init_distributed()
    setup_logging(ctx)
    try:
        convert(ctx, args)
    except ValueError as e:  # a bad source or --out: one `distsplat: error` line, exit 2
        exit_bad_input(e)
    finally:
        destroy(ctx)


if __name__ == "__main__":
    main()
