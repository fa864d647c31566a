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
    shared_gpu_w2
                 the same step of each rank of W = 2 rank processes sharing the ONE GPU in
                 shared-GPU mode (DISTSPLAT_SHARED_GPU=1: gloo, each collective staged through
                 pinned host memory, distsplat/distributed/staging.py), counted and marked as
                 above. Staging syncs by design: each staged collective's transfer to the host
                 (staging.to_host) leaves a `bench/staged` mark, and `staged` says in which
                 range. The count exchange's staged transfer replaces the one host read an NCCL
                 run makes too; the others (the payload all-to-all forward and backward, the
                 divergence check's all-reduce...) exist only here: `staged_extra`. So
                 `nccl_equivalent` = count - staged_extra is what each rank of a real NCCL W = 2
                 would sync (`distsplat_nccl_equivalent`: the same from distsplat's own counter,
                 staging.host_syncs(), which the CPU run has too).

The claim this checks (distsplat/distributed/render.py): the distributed layer adds ONE
sync per forward (the count transfer); gsplat's packed projection does one .item() of its
own (the debug mode does not report isect_tiles' .item()); the divergence check
(train/guards/faults.py, --max_bad_steps) adds none: its flags are read by the loop, after the step,
once their copy has landed.

Needs a CUDA GPU; DRY_RUN=1 runs the same code on the CPU (the torch backend, a small
built-in scene, no sync is reported there; gsplat's side with a stand-in peer,
gsplat_peer.write_standin; the W = 2 ranks plain gloo CPU processes with staging forced,
staging._force_staging, so that they walk the staged path) to check this script's plumbing.
Environment: SCENE (a COLMAP folder; default $DISTSPLAT_DATA/thermos, else the built-in
synthetic scene), DATA_FACTOR (2), WARMUP (3), GSPLAT_PEER (gsplat's peer folder, default
<repo>/.gsplat_peer), PEER_TIMEOUT_S (100: gsplat's run is cut there and reported failed),
SHARED_W2 (1; 0 skips the W = 2 case), TIME_LIMIT_S (300: the W = 2 ranks get what is left of
it since this script started, less WRITE_S = 5, and are killed past it; with under 15 s left
they are not started, and the result says why). In that order: W = 1, gsplat's step, W = 2;
the result is written after each. Writes the snapshot benchmarks/results/host_syncs_cuda_<device>_<date>.json
(host_syncs_dry.json with DRY_RUN=1) and prints one summary line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import step_ranges as sr  # noqa: E402
from benchmarks.step_ranges import SyncCounter  # noqa: E402
from benchmarks.common import gpu_or_plumbing, write_result  # noqa: E402

T_START = time.perf_counter()
WRITE_S = 5.0  # kept back from TIME_LIMIT_S: the last result's writing
MIN_W2_S = 15.0  # the W = 2 ranks are not started with less left (their setup alone takes longer)
# The staged transfer an NCCL run makes too: the count exchange's one host read (exchange_counts).
NCCL_TOO = ("distsplat/count_exchange",)


def count_syncs(fn: Callable[[], object], cuda: bool = True) -> Dict[str, object]:
    """Runs fn once under sync debug mode 'warn' (SyncCounter's record)."""
    counter = SyncCounter(cuda)
    counter.start()
    try:
        fn()
    finally:
        out = counter.stop()
    return out


@contextlib.contextmanager
def marking_staged() -> Iterator[None]:
    """Within: each transfer of a staged collective to the host (staging.to_host: one sync on
    CUDA, exchange.py's and context.py's staged paths) leaves a `bench/staged` mark in the
    running profiler, in the range (and thread) that made it."""
    from distsplat.distributed import staging

    real = staging.to_host

    def to_host(x):
        with torch.profiler.record_function(sr.STAGED):
            pass
        return real(x)

    staging.to_host = to_host
    try:
        yield
    finally:
        staging.to_host = real


def trainer_syncs(trainer, step: int, cuda: bool, staged: bool = False) -> Dict[str, Any]:
    """The syncs of trainer.train_step(step), by range: (SyncCounter's record + by_range, and
    distsplat_host_syncs: what distsplat's own counter, staging.host_syncs(), added). With
    staged (shared-GPU mode), also the staged collectives' host transfers by range."""
    from distsplat.distributed import staging

    counter = SyncCounter(cuda)
    counted: Dict[str, Any] = {}

    def one(s: int) -> None:
        before = staging.host_syncs()
        counter.start()
        try:
            trainer.train_step(s)
        finally:
            counted.update(counter.stop())
            counted["distsplat_host_syncs"] = staging.host_syncs() - before

    # CPU activity only: the ranges and the marks, no device tracing next to the count
    with marking_staged() if staged else contextlib.nullcontext():
        records, _ = sr.profile_steps(one, [step], torch.device("cpu"))
    counted["by_range"] = records[0]["syncs"]
    counted["ranges_missing"] = sr.missing(records, sr.expected(trainer.ctx.world_size))
    if staged:
        by = {k: int(v) for k, v in records[0]["staged"].items()}
        extra = {k: v for k, v in by.items() if k not in NCCL_TOO}
        counted["staged"] = {"count": sum(by.values()), "by_range": by}
        counted["staged_extra"] = {"count": sum(extra.values()), "by_range": extra}
        counted["nccl_equivalent"] = (counted["count"] - counted["staged_extra"]["count"] if cuda else None)
        counted["distsplat_nccl_equivalent"] = counted["distsplat_host_syncs"] - counted["staged_extra"]["count"]
        if cuda and counted["count"] < counted["staged"]["count"]:  # each staged transfer syncs its stream
            counted["warning"] = ("the debug mode reported fewer syncs than staged transfers: nccl_equivalent "
                                  "undercounts")
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


def trainer_config(scene: str, data_factor: int, result_dir: str, cuda: bool, dry: bool):
    """The trainer's options on the scene (the built-in ball scene in a dry run)."""
    from distsplat.train.config import Config, SyntheticConfig

    cfg = Config(data_dir=scene or None, data_factor=data_factor, result_dir=result_dir, max_steps=1000, eval_steps=[],
                 save_steps=[], save_ply=False, backend="gsplat" if cuda else "torch")
    if dry:
        cfg.synthetic = SyntheticConfig(kind="ball", num_cameras=8, num_gaussians=300, width=32, height=24)
    cfg.validate()
    return cfg


def warm_trainer(cfg, ctx, warmup: int):
    """A set-up Trainer after `warmup` steps, whose next step is no refine step."""
    from distsplat.train.trainer import Trainer

    trainer = Trainer(cfg, ctx)
    trainer.setup()
    try:
        for step in range(warmup):
            trainer.train_step(step)
        assert not trainer._is_refine_step(warmup), "count a step without densification"
    except BaseException:
        trainer.cleanup()
        raise
    return trainer


def shared_rank(ctx, spec: Dict[str, Any]) -> Dict[str, Any]:
    """One rank of the W = 2 case (its own process): the step's syncs, staged ones marked."""
    from distsplat.distributed import staging

    if spec["dry"]:  # CPU tensors: walk the staged path all the same (the tests' switch)
        staging._force_staging = True
    cfg = trainer_config(spec["scene"], spec["data_factor"], spec["result_dir"], spec["cuda"], spec["dry"])
    trainer = warm_trainer(cfg, ctx, spec["warmup"])
    try:
        rec = trainer_syncs(trainer, spec["warmup"], spec["cuda"], staged=True)
        rec["rank"], rec["gaussians_local"] = ctx.rank, len(trainer.params["means"])
        rec["context"] = {"device": str(ctx.device), "backend": ctx.backend, "shared_gpu": ctx.shared_gpu,
                          "staged": staging.staged(), "staging_forced": staging._force_staging}
        return rec
    finally:
        trainer.cleanup()


def run_ranks_within(fn: Callable, W: int, args: tuple, timeout_s: float) -> List[Any]:
    """fn(ctx, *args) on W gloo processes (benchmarks/procs.py's ranks), each killed past
    timeout_s (TimeoutError); a rank's exception is raised here with its traceback."""
    import torch.multiprocessing as mp

    from benchmarks import procs

    with tempfile.TemporaryDirectory(prefix="count_syncs_ranks_") as out_dir:
        pc = mp.start_processes(procs._entry, args=(W, procs.free_port(), fn, args, out_dir), nprocs=W,
                                start_method="spawn", join=False)
        deadline = time.monotonic() + timeout_s
        try:
            while not pc.join(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the {W} ranks were still running after {timeout_s:.0f} s and were killed")
        finally:
            for proc in pc.processes:
                if proc.is_alive():
                    proc.kill()
                    proc.join(5)
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(W)]


def shared_gpu_w2(spec: Dict[str, Any], timeout_s: float) -> Dict[str, Any]:
    """The W = 2 case: both ranks' records and, per rank, the counts to read."""
    what = ("one step of Trainer.train_step on each of W = 2 ranks sharing one GPU in shared-GPU mode (gloo, "
            "collectives staged through pinned host memory), counted as `trainer`; staged: the staged collectives' "
            "host transfers (one sync each); staged_extra: those an NCCL run does not make (all but "
            f"{', '.join(NCCL_TOO)}); nccl_equivalent = count - staged_extra")
    if spec["dry"]:
        what = ("DRY RUN: W = 2 gloo CPU ranks with staging forced (no sync debug mode: count 0, "
                "nccl_equivalent None); " + what)
    if timeout_s < MIN_W2_S:
        return {"skipped": f"{timeout_s:.0f} s left of TIME_LIMIT_S, under the {MIN_W2_S:.0f} s the two ranks need",
                "what": what}
    saved = os.environ.get("DISTSPLAT_SHARED_GPU")
    if spec["cuda"]:
        os.environ["DISTSPLAT_SHARED_GPU"] = "1"  # the ranks inherit it: both on cuda:0 over gloo
    t0 = time.perf_counter()
    try:
        ranks = run_ranks_within(shared_rank, 2, (spec,), timeout_s)
    except Exception as e:  # noqa: BLE001 (a cut or failed case is reported, the rest still written)
        return {"failed": f"{type(e).__name__}: {e}"[-4000:], "what": what}
    finally:
        if saved is None:
            os.environ.pop("DISTSPLAT_SHARED_GPU", None)
        else:
            os.environ["DISTSPLAT_SHARED_GPU"] = saved
    return {
        "what": what, "world_size": 2, "wall_s": round(time.perf_counter() - t0, 1),
        "context": ranks[0]["context"],
        "count": [r["count"] for r in ranks],
        "staged": [r["staged"]["count"] for r in ranks],
        "staged_extra": [r["staged_extra"]["count"] for r in ranks],
        "nccl_equivalent": [r["nccl_equivalent"] for r in ranks],
        "distsplat_host_syncs": [r["distsplat_host_syncs"] for r in ranks],
        "distsplat_nccl_equivalent": [r["distsplat_nccl_equivalent"] for r in ranks],
        "ranks": ranks,
    }


def summary(results: Dict[str, Any]) -> str:
    parts = []
    for k, v in results.items():
        if "skipped" in v or "failed" in v:
            parts.append(f"{k} {'skipped' if 'skipped' in v else 'FAILED'}")
        elif k == "shared_gpu_w2":
            nccl = v["nccl_equivalent"] if None not in v["nccl_equivalent"] else v["distsplat_nccl_equivalent"]
            parts.append(f"{k} {v['count']} per rank (of which staged by design {v['staged_extra']}: "
                         f"NCCL-equivalent {nccl}{'' if None not in v['nccl_equivalent'] else ' by distsplat'})")
        else:
            parts.append(f"{k} {v['count']}")
    by = results["trainer"]["by_range"]
    return ("host syncs per step: " + ", ".join(parts) + " (trainer by range: "
            + (", ".join(f"{k} {v:g}" for k, v in by.items()) or "none") + ")"
            + (f"; ranges missing: {results['trainer']['ranges_missing']}" if results["trainer"]["ranges_missing"]
               else ""))


def main() -> None:
    from distsplat.distributed import init_distributed

    device, dry = gpu_or_plumbing("count_syncs.py", "DRY_RUN")
    cuda = device.type == "cuda"
    data = os.environ.get("DISTSPLAT_DATA")
    scene = os.environ.get("SCENE", str(Path(data) / "thermos") if data and not dry else "")
    data_factor = int(os.environ.get("DATA_FACTOR", 2))
    warmup = int(os.environ.get("WARMUP", 3))
    limit = float(os.environ.get("TIME_LIMIT_S", 300))
    out_dir = tempfile.mkdtemp(prefix="count_syncs_")
    cfg = trainer_config(scene, data_factor, out_dir, cuda, dry)
    trainer = warm_trainer(cfg, init_distributed(device=device), warmup)
    try:
        results: Dict[str, Any] = {"trainer": trainer_syncs(trainer, warmup, cuda)}
        results["ours_render"] = render_part(results["trainer"])
        ssim_impl = trainer.ssim_impl
    finally:
        trainer.cleanup()
    if cuda:
        torch.cuda.empty_cache()  # the other processes (gsplat's, the W = 2 ranks) get the device's memory
    payload = {
        "scene": scene or "built-in synthetic", "data_factor": cfg.data_factor, "dry_run": dry,
        "gaussians": trainer.n_all, "image": [trainer.width, trainer.height], "ssim_impl": ssim_impl,
        "counted_step": warmup, "syncs": results,
        "claim": ("distsplat's distributed layer adds one sync per forward (the count transfer); gsplat's "
                  "packed projection does one .item() of its own (its isect_tiles' .item() is not reported "
                  "by the debug mode); the divergence check (--max_bad_steps) adds none in the step. "
                  "ours_render is the trainer's step's train/render range; gsplat_step is gsplat's own "
                  "simple_trainer step; shared_gpu_w2's nccl_equivalent is what a rank of a real NCCL W = 2 "
                  "would sync (its staged collectives' extra syncs taken out)"),
    }
    name = "host_syncs_dry" if dry else "host_syncs_cuda"
    write_result(name, payload)  # W = 1 kept, whatever happens next
    peer_scene = scene or (str(Path(data) / "thermos") if data else "")
    if dry:  # the stand-in's loop ignores the scene; the driver checks it is a folder
        peer_scene = tempfile.mkdtemp(prefix="standin_scene_")
    results["gsplat_step"] = gsplat_step(peer_scene, data_factor, warmup, dry)
    write_result(name, payload)
    if os.environ.get("SHARED_W2", "1") == "1":
        spec = {"scene": scene, "data_factor": data_factor, "warmup": warmup, "cuda": cuda, "dry": dry,
                "result_dir": str(Path(out_dir) / "w2")}
        results["shared_gpu_w2"] = shared_gpu_w2(spec, limit - WRITE_S - (time.perf_counter() - T_START))
    path = write_result(name, payload)
    print(summary(results) + f" -> {path}")


if __name__ == "__main__":
    main()
