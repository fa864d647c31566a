"""Host syncs of one training step on CUDA, counted, not claimed.

torch.cuda.set_sync_debug_mode("warn") makes every synchronizing CUDA call (a device ->
host read such as .item()/.tolist()/nonzero, a pageable host <-> device copy, an explicit
synchronize) raise a warning; the warnings of one step are counted and grouped by the
Python line that caused them (`SyncCounter`). Counted, each after warm-up steps:

    trainer      distsplat's Trainer.train_step at W = 1 (loader, distributed render with
                 the gsplat backend, the trainer's loss, backward, fused Adam, densification
                 bookkeeping) on a non-refine step, with the trainer's options. The step runs
                 under a CPU-only torch.profiler so that its ranges (benchmarks/step_ranges.py)
                 exist: each sync leaves a `bench/sync` mark, and `by_range` says in which
                 range of the step it happened (a sync in backward is reported where the
                 autograd engine replays its warnings: at the end of train/backward).
    ours_render  the syncs of that same step inside train/render: the distributed render's
                 forward as the trainer calls it (no separate call of it).
    gsplat_step  one step of gsplat 1.5.3's own examples/simple_trainer.py as its users run it
                 (packed=False, fused-ssim, its per-step loss.item()), counted inside its own
                 training loop (gsplat_peer.py's probe mode, a subprocess) on the same scene;
                 skipped, with the reason, without the .gsplat_peer folder.

The claim this checks (distsplat/distributed/render.py): the distributed layer adds ONE
sync per forward (the count transfer); gsplat's packed projection does one .item() of its
own (the debug mode does not report isect_tiles' .item()); the divergence check
(train/faults.py, --max_bad_steps) adds none: its flags are read by the loop, after the step,
once their copy has landed.

Needs a CUDA GPU; DRY_RUN=1 runs the same code on the CPU (the torch backend, a small
built-in scene, no sync is reported there; gsplat's side with a stand-in peer,
gsplat_peer.write_standin) to check this script's plumbing. Environment: SCENE (a COLMAP
folder; default $DISTSPLAT_DATA/thermos, else the built-in synthetic scene), DATA_FACTOR (2),
WARMUP (3), GSPLAT_PEER (gsplat's peer folder, default <repo>/.gsplat_peer), PEER_TIMEOUT_S (100:
gsplat's run is cut there and reported failed). Writes
benchmarks/results/host_syncs_cuda.json (host_syncs_dry.json with DRY_RUN=1) and prints one
summary line.
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
from typing import Any, Callable, Dict, List, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import step_ranges as sr  # noqa: E402
from benchmarks.common import write_result  # noqa: E402

SYNC_WARNING = "synchronizing CUDA operation"


class SyncCounter:
    """Counts the host syncs CUDA's sync debug mode reports between start() and stop(): the
    count, where they came from (the line that warned) and the Python stack of each (a sync
    inside a library function warns at that function's line: the stack names our caller).
    While a profiler records, each sync also leaves a `bench/sync` mark in it. Without CUDA
    nothing is reported (the plumbing still runs)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.caught: List[Any] = []
        self._scope: Optional[warnings.catch_warnings] = None

    def _hook(self, message, category, filename, lineno, file=None, line=None) -> None:
        if SYNC_WARNING not in str(message):  # not a sync (e.g. the debug mode's own notice)
            return
        stack = [f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} {f.name}"
                 for f in traceback.extract_stack()[:-1]]
        self.caught.append((filename, lineno, stack[-8:]))
        if torch.autograd._profiler_enabled():
            with torch.profiler.record_function(sr.SYNC):
                pass

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.caught = []
        self._scope = warnings.catch_warnings()
        self._scope.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._hook
        if self.cuda:
            torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> Dict[str, Any]:
        try:
            if self.cuda:
                torch.cuda.set_sync_debug_mode(0)
        finally:
            if self._scope is not None:
                self._scope.__exit__(None, None, None)  # filters and showwarning as they were
                self._scope = None
        if self.cuda:
            torch.cuda.synchronize()
        where = collections.Counter(
            f"{Path(f).parent.name}/{Path(f).name}:{n}: {linecache.getline(f, n).strip()[:100]}"
            for f, n, _ in self.caught)
        return {"count": len(self.caught), "where": dict(where.most_common()),
                "stacks": [st for _, _, st in self.caught]}


def count_syncs(fn: Callable[[], object], cuda: bool = True) -> Dict[str, object]:
    """Runs fn once under sync debug mode 'warn' (SyncCounter's record)."""
    counter = SyncCounter(cuda)
    counter.start()
    try:
        fn()
    finally:
        out = counter.stop()
    return out


def trainer_syncs(trainer, step: int, cuda: bool) -> Dict[str, Any]:
    """The syncs of trainer.train_step(step), by range: (SyncCounter's record + by_range)."""
    counter = SyncCounter(cuda)
    counted: Dict[str, Any] = {}

    def one(s: int) -> None:
        counter.start()
        try:
            trainer.train_step(s)
        finally:
            counted.update(counter.stop())

    # CPU activity only: the ranges and the marks, no device tracing next to the count
    records, _ = sr.profile_steps(one, [step], torch.device("cpu"))
    counted["by_range"] = records[0]["syncs"]
    counted["ranges_missing"] = sr.missing(records, sr.expected(trainer.ctx.world_size))
    return counted


def render_part(counted: Dict[str, Any]) -> Dict[str, Any]:
    """The syncs of the trainer's step that happened inside its render (train/render)."""
    by = {k: v for k, v in counted["by_range"].items() if k.startswith(("distsplat/", "train/render"))
          and k != "distsplat/payload_exchange_backward"}
    return {"count": int(sum(by.values())), "by_range": by,
            "what": "the syncs of the trainer step above inside train/render (the distributed render's forward)"}


def gsplat_step(scene: str, data_factor: int, warmup: int, dry: bool) -> Dict[str, Any]:
    """One step of gsplat's own trainer, counted in its loop (gsplat_peer.py's probe)."""
    from benchmarks import gsplat_peer

    peer = None
    if dry:
        peer = gsplat_peer.write_standin(Path(tempfile.mkdtemp(prefix="standin_peer_")))
    elif not (gsplat_peer.PEER / "BUILD.json").is_file():
        return {"skipped": f"no gsplat peer at {gsplat_peer.PEER} (scripts/prepare_gsplat_peer.sh makes it; carry "
                           ".gsplat_peer): gsplat's own step not counted"}
    if not scene:
        return {"skipped": "gsplat's trainer needs a COLMAP scene (SCENE or $DISTSPLAT_DATA/thermos)"}
    res = gsplat_peer.run_probe("default", scene, data_factor, tempfile.mkdtemp(prefix="peer_syncs_"), warmup,
                                steps=1, count_syncs=True, peer=peer,
                                timeout_s=float(os.environ.get("PEER_TIMEOUT_S", 100)))
    if res.get("returncode") != 0:
        return {"failed": res}
    out = dict(res["syncs"] or {})
    out["what"] = ("one step of gsplat's examples/simple_trainer.py (its defaults: packed=False, fused-ssim), "
                   f"step {warmup + 1} of its loop, counted in the loop (gsplat_peer.py probe mode)")
    if res.get("standin"):
        out["what"] = "DRY RUN: a stand-in peer loop (no gsplat code)"
    return out


def main() -> None:
    dry = os.environ.get("DRY_RUN") == "1"
    cuda = torch.cuda.is_available() and not dry
    if not cuda and not dry:
        sys.exit("count_syncs.py needs a CUDA GPU (torch.cuda.is_available() is False; DRY_RUN=1 checks the "
                 "plumbing on the CPU)")
    from distsplat.distributed import init_distributed
    from distsplat.train.config import Config, SyntheticConfig
    from distsplat.train.trainer import Trainer

    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        from distsplat.render.gsplat_ext import ensure_gsplat_ops

        print(f"gsplat ops: {ensure_gsplat_ops()}")
    data = os.environ.get("DISTSPLAT_DATA")
    scene = os.environ.get("SCENE", str(Path(data) / "thermos") if data and not dry else "")
    data_factor = int(os.environ.get("DATA_FACTOR", 2))
    warmup = int(os.environ.get("WARMUP", 3))
    out_dir = tempfile.mkdtemp(prefix="count_syncs_")
    cfg = Config(data_dir=scene or None, data_factor=data_factor, result_dir=out_dir, max_steps=1000, eval_steps=[],
                 save_steps=[], save_ply=False, disable_viewer=True, backend="gsplat" if cuda else "torch")
    if dry:
        cfg.synthetic = SyntheticConfig(kind="ball", num_cameras=8, num_gaussians=300, width=32, height=24)
    cfg.validate()
    trainer = Trainer(cfg, init_distributed(device=device))
    trainer.setup()
    try:
        for step in range(warmup):
            trainer.train_step(step)
        assert not trainer._is_refine_step(warmup), "count a step without densification"
        results: Dict[str, Any] = {"trainer": trainer_syncs(trainer, warmup, cuda)}
        results["ours_render"] = render_part(results["trainer"])
        ssim_impl = trainer.ssim_impl
    finally:
        trainer.cleanup()
    peer_scene = scene or (str(Path(data) / "thermos") if data else "")
    if dry:  # the stand-in's loop ignores the scene; the driver checks it is a folder
        peer_scene = tempfile.mkdtemp(prefix="standin_scene_")
    results["gsplat_step"] = gsplat_step(peer_scene, data_factor, warmup, dry)
    payload = {
        "scene": scene or "built-in synthetic", "data_factor": cfg.data_factor, "dry_run": dry,
        "gaussians": trainer.n_all, "image": [trainer.width, trainer.height], "ssim_impl": ssim_impl,
        "counted_step": warmup, "syncs": results,
        "claim": ("distsplat's distributed layer adds one sync per forward (the count transfer); gsplat's "
                  "packed projection does one .item() of its own (its isect_tiles' .item() is not reported "
                  "by the debug mode); the divergence check (--max_bad_steps) adds none in the step. "
                  "ours_render is the trainer's step's train/render range; gsplat_step is gsplat's own "
                  "simple_trainer step"),
    }
    path = write_result("host_syncs_dry" if dry else "host_syncs_cuda", payload)
    parts = [f"{k} {v['count']}" if "count" in v else f"{k} {'skipped' if 'skipped' in v else 'FAILED'}"
             for k, v in results.items()]
    by = results["trainer"]["by_range"]
    print("host syncs per step: " + ", ".join(parts) + " (trainer by range: "
          + (", ".join(f"{k} {v:g}" for k, v in by.items()) or "none") + ")"
          + (f"; ranges missing: {results['trainer']['ranges_missing']}" if results["trainer"]["ranges_missing"]
             else "") + f" -> {path}")


if __name__ == "__main__":
    main()
