"""Host syncs of one training step on CUDA, counted, not claimed.

torch.cuda.set_sync_debug_mode("warn") makes every synchronizing CUDA call (a device ->
host read such as .item()/.tolist()/nonzero, a pageable host <-> device copy, an explicit
synchronize) raise a warning; the warnings of one step are counted and grouped by the
Python line that caused them. Three steps are counted, each after warm-up steps:

    trainer     distsplat's Trainer.train_step at W = 1 (loader, distributed render with
                the gsplat backend, loss, backward, Adam, densification bookkeeping) on a
                non-refine step
    ours_render one distributed_rasterize forward + backward at W = 1 (the render alone)
    gsplat      the same render written with gsplat.rasterization(packed=True), + backward
    gsplat_step a training step written with gsplat.rasterization(packed=False, as gsplat's
                trainer renders), the trainer's loss and Adam (no densification): the
                counterpart of `trainer`

The claim this checks (distsplat/distributed/render.py): the distributed layer adds ONE
sync per forward (the count transfer); gsplat's packed projection does one .item() of its
own (the debug mode does not report isect_tiles' .item()); the divergence check
(train/faults.py, --max_bad_steps) adds none: its flags are read by the loop, after the step,
once their copy has landed.

Needs a CUDA GPU. Environment: SCENE (a COLMAP folder; default $DISTSPLAT_DATA/thermos,
else the built-in synthetic scene), DATA_FACTOR (2), WARMUP (3). Writes
benchmarks/results/host_syncs_cuda.json and prints one summary line.
"""

from __future__ import annotations

import collections
import linecache
import os
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Callable, Dict

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import write_result  # noqa: E402


def count_syncs(fn: Callable[[], object]) -> Dict[str, object]:
    """Runs fn once under sync debug mode 'warn'; returns the count, where they came from
    (the line that warned) and the Python stack of each (a sync inside a library function
    warns at that function's line: the stack names our caller)."""
    torch.cuda.synchronize()
    caught = []

    def hook(message, category, filename, lineno, file=None, line=None):
        if "synchronizing CUDA operation" in str(message):  # not the debug mode's own notice
            stack = [f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} {f.name}"
                     for f in traceback.extract_stack()[:-1]]
            caught.append((filename, lineno, stack[-8:]))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    where = collections.Counter(
        f"{Path(f).parent.name}/{Path(f).name}:{n}: {linecache.getline(f, n).strip()[:100]}" for f, n, _ in caught)
    return {"count": len(caught), "where": dict(where.most_common()), "stacks": [st for _, _, st in caught]}


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("count_syncs.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    from distsplat.distributed import distributed_rasterize, init_distributed
    from distsplat.render.gsplat_ext import ensure_gsplat_ops
    from distsplat.train.config import Config
    from distsplat.train.gaussians import activated
    from distsplat.train.trainer import Trainer

    print(f"gsplat ops: {ensure_gsplat_ops()}")
    data = os.environ.get("DISTSPLAT_DATA")
    scene = os.environ.get("SCENE", str(Path(data) / "thermos") if data else "")
    warmup = int(os.environ.get("WARMUP", 3))
    out_dir = tempfile.mkdtemp(prefix="count_syncs_")
    cfg = Config(data_dir=scene or None, data_factor=int(os.environ.get("DATA_FACTOR", 2)),
                 result_dir=out_dir, max_steps=1000, eval_steps=[], save_steps=[], save_ply=False,
                 disable_viewer=True, backend="gsplat")
    cfg.validate()
    ctx = init_distributed()
    trainer = Trainer(cfg, ctx)
    trainer.setup()
    try:
        for step in range(warmup):
            trainer.train_step(step)
        assert not trainer._is_refine_step(warmup), "count a step without densification"
        results = {"trainer": count_syncs(lambda: trainer.train_step(warmup))}

        g = {k: v.detach().requires_grad_() for k, v in activated(trainer.params, cfg.sh_degree).items()}
        cams = trainer.train_idx[:1].to(trainer.device)
        viewmats, Ks = trainer.viewmats[trainer.train_idx[:1]], trainer.Ks[cams]  # Viewmats: a host index
        W, H = trainer.width, trainer.height
        owner = torch.zeros(1, dtype=torch.int64, device=trainer.device)

        def ours():
            c, a, _ = distributed_rasterize(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                                            viewmats, Ks, W, H, owner, sh_degree=cfg.sh_degree,
                                            backend="gsplat", check_cameras=True)
            (c.sum() + a.sum()).backward()

        def theirs():
            from gsplat import rasterization

            c, a, _ = rasterization(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                                    viewmats, Ks, W, H, sh_degree=cfg.sh_degree, packed=True)
            (c.sum() + a.sum()).backward()

        from distsplat.train.gaussians import create_optimizers
        from distsplat.train.losses import photometric_loss

        gt = torch.rand(1, H, W, 3, device=trainer.device)
        params = {k: torch.nn.Parameter(v.detach().clone()) for k, v in trainer.params.items()}
        opts = create_optimizers(torch.nn.ParameterDict(params), global_batch=1, scene_scale=trainer.scene_scale)

        def gsplat_step():
            """One training step written with gsplat.rasterization as gsplat's simple_trainer
            renders (packed=False, its default), our loss (trainer.ssim_impl) and Adam; no
            densification, no progress-bar read (gsplat's trainer adds loss.item() per step)."""
            from gsplat import rasterization

            a = activated(params, cfg.sh_degree)
            c, _, _ = rasterization(a["means"], a["quats"], a["scales"], a["opacities"], a["colors"],
                                    viewmats, Ks, W, H, sh_degree=cfg.sh_degree, packed=False)
            photometric_loss(c, gt, cfg.ssim_lambda, trainer.ssim_impl).backward()
            for o in opts.values():
                o.step()
                o.zero_grad(set_to_none=True)

        for fn in (ours, theirs, gsplat_step):  # warm-up: kernels loaded, caches filled
            fn()
        results["ours_render"] = count_syncs(ours)
        results["gsplat"] = count_syncs(theirs)
        results["gsplat_step"] = count_syncs(gsplat_step)
    finally:
        trainer.cleanup()
    payload = {
        "scene": scene or "built-in synthetic", "data_factor": cfg.data_factor,
        "gaussians": trainer.n_all, "image": [trainer.width, trainer.height],
        "counted_step": warmup, "syncs": results,
        "claim": ("distsplat's distributed layer adds one sync per forward (the count transfer); gsplat's "
                  "packed projection does one .item() of its own (its isect_tiles' .item() is not reported "
                  "by the debug mode); the divergence check (--max_bad_steps) adds none in the step. "
                  "gsplat_step is the trainer's counterpart written with gsplat.rasterization(packed=False)"),
    }
    path = write_result("host_syncs_cuda", payload)
    print("host syncs per step: " + ", ".join(f"{k} {v['count']}" for k, v in results.items()) + f" -> {path}")


if __name__ == "__main__":
    main()
