"""Runs gsplat 1.5.3's OWN examples/simple_trainer.py as the peer reference for distsplat's
training numbers (issue 14), and writes benchmarks/results/gsplat_peer_<strategy>.json.

gsplat's trainer code is never in this repository: scripts/prepare_gsplat_peer.sh puts it,
with the dependencies the GPU machine lacks (pycolmap fork, nerfview, fused_ssim built for
sm_90), in the git-ignored .gsplat_peer/, which travels to the device as a carried folder.
This driver changes none of those files; at runtime, before gsplat's `__main__` block runs:

1. gsplat's CUDA ops come from the prebuilt .gsplat_ext (distsplat.render.gsplat_ext, as
   distsplat itself does), so no JIT build spends the GPU time.
2. torchmetrics' LPIPS (which downloads AlexNet weights; the device has no internet) is
   replaced by a module that returns NaN: gsplat's `lpips` figure is NaN, nothing else changes.
3. The test split: distsplat reads `test.txt`/`train.txt` of the capture when present
   (distsplat/data/colmap.py); gsplat takes every 8th name-sorted image. gsplat's Dataset gets
   its indices from those files too (a wrapper around Dataset.__init__), so PSNRs are over the
   same images; the JSON says whether gsplat's own split already was the same.
4. Without imageio-ffmpeg (not on the device) the trajectory video cannot be written:
   `--disable_video` is added (it only renders a video after the eval).
5. Only with PEER_RESET=1: gsplat 1.5.3's DefaultStrategy tests `step % self.reset_every
   == 0 & step > 0`, a chained comparison that is never true, so its trainer never resets
   opacities; distsplat's DefaultStrategy (distsplat/train/model/strategies.py) does, every
   `reset_every` steps before `refine_stop_iter`. PEER_RESET=1 adds that reset after gsplat's
   own step_post_backward (gsplat's `reset_opa`, the value its code intends), so the two
   trainers run the same schedule; the result is gsplat_peer_<strategy>_reset.json. Without
   it the peer is gsplat exactly as released (gsplat_peer_<strategy>.json).

Usage (GPU machine, repo root, after installing .whl; see scripts/prepare_gsplat_peer.sh):
    python3 benchmarks/gsplat_peer.py default --data_dir .gpu_data/thermos --data_factor 1 \
        --max_steps 7000 --eval_steps 7000 --save_steps 7000 --disable_viewer --result_dir /tmp/peer_default
Everything after the script name is gsplat's simple_trainer CLI, unchanged. Both strategies in
one GPU session, with .whl .gpu_data .gsplat_ext .gsplat_peer copied beside the repo (scripts/gpu_prepare.sh
makes them): install the wheels as scripts/gpu_setup.sh does, export PYTHONPATH=/tmp/site:$PWD,
then `for s in default mcmc; do python3 benchmarks/gsplat_peer.py $s ... --result_dir /tmp/peer_$s; done`
and keep benchmarks/results/gsplat_peer_*.json. Environment:
GSPLAT_PEER (the peer folder, default <repo>/.gsplat_peer), DISTSPLAT_GSPLAT_EXT (default
<repo>/.gsplat_ext), DISTSPLAT_COMMIT (else git, else .gpu_data/COMMIT), PEER_DRY_RUN=1 (no
CUDA: set everything up, parse the arguments, build gsplat's Parser and Datasets, load one
image, print the split; training is not run), PEER_RESET=1 (point 5 above).

Probe mode, PEER_PROBE=<file.json> (what bench_step_vs_gsplat.py and count_syncs.py run, via
`run_probe`): gsplat's training loop runs as always, and its steps are measured from the
loop itself, nothing of gsplat's changed: `tqdm.tqdm` (its loop is `for step in
tqdm.tqdm(range(init_step, max_steps))`) is replaced by a subclass whose iteration marks the
step boundaries (`StepProbe`): the device is synchronized at each boundary (as gsplat's own
per-step loss.item() does), PEER_PROBE_WARMUP (10) steps are skipped, the next
PEER_PROBE_STEPS (50) are timed, the next PEER_PROBE_PROFILE (0) run under torch.profiler
(each inside a `bench/step` range: step time and kernels per step, benchmarks/step_ranges.py),
and with PEER_PROBE_SYNCS=1 the step after those is counted under CUDA's sync debug mode
(step_ranges.SyncCounter). The result goes to the JSON file, not to benchmarks/results;
--max_steps must leave one more step (gsplat saves a checkpoint in its last).
`write_standin(folder)` writes a stand-in peer (no gsplat code: a CPU loop of the same shape)
for checking this plumbing without a GPU (GSPLAT_PEER=folder).
"""

from __future__ import annotations

import glob
import json
import math
import os
import runpy
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PEER = Path(os.environ.get("GSPLAT_PEER", REPO / ".gsplat_peer"))
STUBS: List[str] = []  # what this driver replaced, for the output and the JSON


def die(msg: str) -> None:
    print(f"gsplat_peer: {msg}", file=sys.stderr)
    sys.exit(2)


def arg_value(argv: List[str], flag: str) -> Optional[str]:
    """The value after `flag` (or `flag=value`) in gsplat's CLI arguments."""
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def setup_paths() -> Dict[str, Any]:
    build = PEER / "BUILD.json"
    if not build.is_file():
        die(f"{build} not found: make the peer folder with scripts/prepare_gsplat_peer.sh and carry .gsplat_peer")
    # The peer's packages first: gsplat's examples import `datasets` and `utils` as top-level
    # names (a `datasets` namespace package, which any regular `datasets` package would shadow).
    sys.path[:0] = [str(PEER / "examples"), str(PEER / "site")]
    # gsplat's examples/datasets/ has no __init__.py: a namespace package, which a regular
    # `datasets` package anywhere on sys.path (Hugging Face's) would win over. Bind the name.
    pkg = types.ModuleType("datasets", "gsplat 1.5.3 examples/datasets (the peer)")
    pkg.__path__ = [str(PEER / "examples" / "datasets")]
    sys.modules["datasets"] = pkg
    return json.loads(build.read_text())


def setup_gsplat_ops(dry_run: bool) -> str:
    os.environ.setdefault("DISTSPLAT_GSPLAT_EXT", str(REPO / ".gsplat_ext"))
    if dry_run:
        return "not loaded (dry run)"
    import torch

    if not torch.cuda.is_available():
        return "not loaded (no CUDA: a stand-in peer only)"
    from distsplat.render.gsplat_ext import ensure_gsplat_ops

    return ensure_gsplat_ops()


def stub_lpips() -> None:
    import torch
    import torchmetrics.image as tm_image
    import torchmetrics.image.lpip as tm_lpip

    class NaNLPIPS(torch.nn.Module):
        """Stands in for LearnedPerceptualImagePatchSimilarity (its AlexNet/VGG weights are a
        download; the device has no internet): every value is NaN."""

        def __init__(self, net_type: str = "alex", normalize: bool = False, **kwargs: Any) -> None:
            super().__init__()
            self.net_type = net_type

        def forward(self, img1: torch.Tensor, img2: torch.Tensor) -> torch.Tensor:
            return torch.tensor(float("nan"), device=img1.device)

    tm_lpip.LearnedPerceptualImagePatchSimilarity = NaNLPIPS
    tm_image.LearnedPerceptualImagePatchSimilarity = NaNLPIPS
    STUBS.append("torchmetrics LearnedPerceptualImagePatchSimilarity -> NaN (AlexNet weights need a download; "
                 "gsplat's lpips figure is NaN)")


def reset_repaired(step_post_backward: Callable[..., None]) -> Callable[..., None]:
    """gsplat's DefaultStrategy.step_post_backward followed by the opacity reset its code
    intends (point 5 of the module doc): distsplat's own rule and call,
    distsplat.train.model.strategies.reset_opacities_if_due (gsplat's reset_opa at 0 < step <
    refine_stop_iter, step a multiple of reset_every)."""
    from distsplat.train.model.strategies import reset_opacities_if_due

    def step_post_backward_with_reset(self: Any, params: Any, optimizers: Any, state: Any, step: int,
                                      info: Any, packed: bool = False) -> None:
        step_post_backward(self, params, optimizers, state, step, info, packed=packed)
        reset_opacities_if_due(self, params, optimizers, state, step)

    return step_post_backward_with_reset


def patch_opacity_reset() -> None:
    from gsplat.strategy import DefaultStrategy

    DefaultStrategy.step_post_backward = reset_repaired(DefaultStrategy.step_post_backward)
    STUBS.append("DefaultStrategy: the opacity reset every reset_every steps repaired (PEER_RESET=1; gsplat "
                 "1.5.3's `step % reset_every == 0 & step > 0` is never true), as distsplat's DefaultStrategy")


def read_names(path: Path) -> List[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


SPLIT: Dict[str, Any] = {}


def patch_split(data_dir: Path) -> None:
    """gsplat's Dataset takes index % test_every == 0 as the test set; distsplat reads
    test.txt/train.txt when the capture has them. Make gsplat use the files too."""
    import datasets.colmap as gs_colmap
    import numpy as np

    if not str(Path(gs_colmap.__file__).resolve()).startswith(str(PEER.resolve())):
        die(f"`datasets.colmap` resolved to {gs_colmap.__file__}, not gsplat's examples in {PEER}")
    test_file, train_file = data_dir / "test.txt", data_dir / "train.txt"
    original_init = gs_colmap.Dataset.__init__

    def init(self: Any, parser: Any, split: str = "train", *args: Any, **kwargs: Any) -> None:
        original_init(self, parser, split, *args, **kwargs)
        names = list(parser.image_names)
        gsplat_own = [names[i] for i in self.indices]
        if test_file.is_file():
            pos = {n: i for i, n in enumerate(names)}
            test_names = read_names(test_file)
            unknown = [n for n in test_names if n not in pos]
            if unknown:
                die(f"{test_file}: {unknown[:3]} are not images of the COLMAP model")
            test = sorted(pos[n] for n in test_names)
            if train_file.is_file():
                train = sorted(pos[n] for n in read_names(train_file))
            else:
                train = sorted(set(range(len(names))) - set(test))
            self.indices = np.array(test if split != "train" else train, dtype=np.int64)
            source = f"{test_file.name}/{train_file.name} (as distsplat)"
        else:
            source = f"gsplat's own (every {parser.test_every}th name-sorted image, as distsplat without test.txt)"
        used = [names[i] for i in self.indices]
        SPLIT["train" if split == "train" else "test"] = {
            "source": source, "count": len(used), "names": used if split != "train" else None,
            "same_as_gsplat_own": used == gsplat_own,
        }

    gs_colmap.Dataset.__init__ = init


def gsplat_stats(result_dir: Path) -> Dict[str, Any]:
    stats: Dict[str, Any] = {}
    for path in sorted(glob.glob(str(result_dir / "stats" / "*.json"))):
        with open(path) as f:
            d = json.load(f)  # gsplat writes NaN for the stubbed lpips
        stats[Path(path).stem] = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}
    return stats


def dry_run(argv: List[str]) -> None:
    """What can be checked without CUDA: gsplat's CLI, its Parser and Datasets on the capture."""
    import tyro

    # Import simple_trainer as a module (its __main__ block is the training): every import
    # must resolve, and its configs must parse these arguments.
    trainer = runpy.run_path(str(PEER / "examples" / "simple_trainer.py"), run_name="gsplat_simple_trainer")
    Config = trainer["Config"]
    configs = {
        "default": ("", Config(strategy=trainer["DefaultStrategy"](verbose=True))),
        "mcmc": ("", Config(init_opa=0.5, init_scale=0.1, opacity_reg=0.01, scale_reg=0.01,
                            strategy=trainer["MCMCStrategy"](verbose=True))),
    }
    sys.argv = ["simple_trainer.py"] + argv
    cfg = tyro.extras.overridable_config_cli(configs)
    cfg.adjust_steps(cfg.steps_scaler)
    print(f"gsplat_peer: dry run: parsed {type(cfg.strategy).__name__}, data_dir={cfg.data_dir}, "
          f"factor={cfg.data_factor}, max_steps={cfg.max_steps}, eval_steps={cfg.eval_steps}, "
          f"disable_video={cfg.disable_video}, normalize_world_space={cfg.normalize_world_space}")
    from datasets.colmap import Dataset, Parser

    parser = Parser(data_dir=cfg.data_dir, factor=cfg.data_factor, normalize=cfg.normalize_world_space,
                    test_every=cfg.test_every)
    train, val = Dataset(parser, split="train"), Dataset(parser, split="val")
    item = val[0]
    print(f"gsplat_peer: dry run: {len(parser.image_names)} images, {len(parser.points)} points, "
          f"scene_scale {parser.scene_scale:.4f}, {len(train)} train / {len(val)} test, test image 0 "
          f"{parser.image_names[val.indices[0]]} {tuple(item['image'].shape)} K[0]={item['K'][0].tolist()}")


class StepProbe:
    """Measures gsplat's training loop from its iteration (the module doc's probe mode).
    boundary(i) runs when iteration i starts, i.e. when step i - 1 has ended."""

    def __init__(self, warmup: int, steps: int, profile: int, count_syncs: bool) -> None:
        import torch

        self.warmup, self.steps, self.profile, self.count_syncs = warmup, steps, profile, count_syncs
        self.cuda = torch.cuda.is_available()
        self.claimed = False
        self.started = 0  # iterations of gsplat's loop begun
        self.stamps: Dict[int, float] = {}
        self.prof: Any = None
        self.range: Any = None
        self.profiled: List[Dict[str, Any]] = []
        self.counter: Any = None
        self.syncs: Optional[Dict[str, Any]] = None

    @staticmethod
    def from_env() -> "StepProbe":
        return StepProbe(int(os.environ.get("PEER_PROBE_WARMUP", 10)), int(os.environ.get("PEER_PROBE_STEPS", 50)),
                         int(os.environ.get("PEER_PROBE_PROFILE", 0)), os.environ.get("PEER_PROBE_SYNCS") == "1")

    @property
    def needed(self) -> int:
        """Iterations the loop must start (the last one ends the last measured step)."""
        return self.warmup + self.steps + self.profile + int(self.count_syncs) + 1

    def install(self) -> None:
        """tqdm.tqdm -> a subclass whose first iteration over a range (gsplat's training loop)
        goes through boundary(); every other tqdm is unchanged."""
        import tqdm

        probe, base = self, tqdm.tqdm

        class ProbedTqdm(base):  # type: ignore[misc, valid-type]
            def __iter__(self):
                if probe.claimed or not isinstance(self.iterable, range):
                    return super().__iter__()
                probe.claimed = True
                return probe.wrap(super().__iter__())

        tqdm.tqdm = ProbedTqdm

    def wrap(self, it):
        for i, item in enumerate(it):
            self.boundary(i)
            self.started = i + 1
            yield item
        self.boundary(self.started)

    def boundary(self, i: int) -> None:
        import torch

        from benchmarks import step_ranges as sr

        if self.counter is not None and i == self.warmup + self.steps + self.profile + 1:
            self.syncs = self.counter.stop()
            self.counter = None
        if self.range is not None:
            self.range.__exit__(None, None, None)
            self.range = None
        if self.cuda:
            torch.cuda.synchronize()
        if self.warmup <= i <= self.warmup + self.steps:
            self.stamps[i] = time.perf_counter()
        p0, p1 = self.warmup + self.steps, self.warmup + self.steps + self.profile
        if self.prof is not None and i == p1:
            self.prof.__exit__(None, None, None)
            self.profiled = sr.analyse(*sr.spans_and_ops(self.prof), kernels=True)
            self.prof = None
        if self.profile and i == p0:
            from torch.profiler import ProfilerActivity, profile

            self.prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else []))
            self.prof.__enter__()
        if self.prof is not None:
            self.range = torch.profiler.record_function(sr.STEP)
            self.range.__enter__()
        if self.count_syncs and i == p1:
            from benchmarks.step_ranges import SyncCounter

            self.counter = SyncCounter(self.cuda)
            self.counter.start()

    def step_ms(self) -> List[float]:
        return [1e3 * (self.stamps[i + 1] - self.stamps[i]) for i in range(self.warmup, self.warmup + self.steps)
                if i in self.stamps and i + 1 in self.stamps]

    def result(self) -> Dict[str, Any]:
        import statistics

        ms = self.step_ms()
        out: Dict[str, Any] = {
            "loop_found": self.claimed, "iterations_started": self.started,
            "iterations_needed": self.needed, "warmup": self.warmup, "steps": self.steps,
            "step_ms": ms, "median_step_ms": statistics.median(ms) if ms else None,
            "timing": "wall time between iteration starts of gsplat's loop, the device synchronized at each",
        }
        if self.profile:
            out["profiled"] = [{"step_ms": r["step_ms"], "cpu_ms": sum(r["cpu_ms"].values()),
                                "device_ms": sum(r["device_ms"].values()),
                                "kernels": r.get("kernels", {}).get("bench/other", {})} for r in self.profiled]
        if self.count_syncs:
            out["syncs"] = self.syncs
        return out

    def summary(self) -> str:
        ms = self.step_ms()
        med = f"{sorted(ms)[len(ms) // 2]:.2f} ms" if ms else "no step timed"
        syncs = self.syncs["count"] if self.syncs else "?"
        return (f"{len(ms)} steps timed, median {med}" + (f", {len(self.profiled)} profiled" if self.profile else "")
                + (f", {syncs} host syncs in one step" if self.count_syncs else ""))


def run_probe(strategy: str, data_dir: str, data_factor: int, result_dir: str, warmup: int, steps: int,
              profile: int = 0, count_syncs: bool = False, extra_args: Optional[List[str]] = None,
              peer: Optional[Path] = None, timeout_s: float = 600) -> Dict[str, Any]:
    """gsplat's own simple_trainer in probe mode, in a subprocess (a process of its own, as
    its users run it): the probe's JSON, with `returncode` and the output's tail on failure."""
    import subprocess
    import tempfile

    probe = StepProbe(warmup, steps, profile, count_syncs)
    n = probe.needed
    with tempfile.TemporaryDirectory(prefix="gsplat_probe_") as tmp:
        out = Path(tmp) / "probe.json"
        env = {**os.environ, "PEER_PROBE": str(out), "PEER_PROBE_WARMUP": str(warmup),
               "PEER_PROBE_STEPS": str(steps), "PEER_PROBE_PROFILE": str(profile),
               "PEER_PROBE_SYNCS": "1" if count_syncs else "0"}
        env.pop("PEER_DRY_RUN", None)
        if peer is not None:
            env["GSPLAT_PEER"] = str(peer)
        cmd = [sys.executable, str(Path(__file__).resolve()), strategy, "--data_dir", str(data_dir),
               "--data_factor", str(data_factor), "--result_dir", str(result_dir), "--max_steps", str(n),
               "--eval_steps", str(n + 1), "--save_steps", str(n + 1), "--disable_viewer"] + list(extra_args or [])
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
            rc, tail = p.returncode, (p.stdout + p.stderr)[-3000:]
        except subprocess.TimeoutExpired as e:
            rc, tail = 124, f"timed out after {timeout_s:g} s: " + str(e.stdout or "")[-2000:]
        if rc != 0 or not out.is_file():
            return {"returncode": rc, "error": "gsplat's trainer (probe mode) failed", "output_tail": tail,
                    "command": cmd}
        res = json.loads(out.read_text())
    res.update(returncode=0, command=cmd)
    return res


STANDIN_TRAINER = '''"""A STAND-IN for gsplat's examples/simple_trainer.py, written by benchmarks/gsplat_peer.py's
write_standin: no gsplat code, a CPU loop of the same shape (`for step in tqdm.tqdm(range(...))`,
a loss read per step), for checking the peer driver's plumbing without a GPU."""
import argparse
import json
import os

import torch
import tqdm

from datasets.colmap import Dataset, Parser  # noqa: F401 (the peer's import, as gsplat's)

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("strategy")
    ap.add_argument("--max_steps", type=int, default=30)
    ap.add_argument("--result_dir", default="results")
    args, _ = ap.parse_known_args()
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g, requires_grad=True)
    x = torch.randn(256, 64, generator=g)
    opt = torch.optim.Adam([w], lr=1e-3)
    pbar = tqdm.tqdm(range(0, args.max_steps))
    for step in pbar:
        loss = (x @ w).tanh().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        pbar.set_description(f"loss={loss.item():.3f}")
    os.makedirs(os.path.join(args.result_dir, "stats"), exist_ok=True)
    with open(os.path.join(args.result_dir, "stats", f"train_step{args.max_steps - 1:04d}_rank0.json"), "w") as f:
        json.dump({"mem": 0.0, "ellipse_time": 0.0, "num_GS": 64}, f)
'''

STANDIN_COLMAP = '''"""A STAND-IN for gsplat's examples/datasets/colmap.py (benchmarks/gsplat_peer.py write_standin)."""


class Parser:
    def __init__(self, *args, **kwargs):
        self.image_names = []


class Dataset:
    def __init__(self, parser, split="train", *args, **kwargs):
        self.indices = []
'''


def write_standin(folder: Path) -> Path:
    """A stand-in peer folder (module doc): BUILD.json saying so, examples/simple_trainer.py
    and examples/datasets/colmap.py of the stand-in. Returns `folder`."""
    folder = Path(folder)
    (folder / "examples" / "datasets").mkdir(parents=True, exist_ok=True)
    (folder / "site").mkdir(exist_ok=True)
    (folder / "examples" / "simple_trainer.py").write_text(STANDIN_TRAINER)
    (folder / "examples" / "datasets" / "colmap.py").write_text(STANDIN_COLMAP)
    (folder / "BUILD.json").write_text(json.dumps({"standin": True, "sources": "stand-in (gsplat_peer.write_standin): "
                                                   "no gsplat code"}))
    return folder


def main() -> int:
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("default", "mcmc"):
        die("usage: gsplat_peer.py default|mcmc [gsplat simple_trainer flags ...]")
    strategy = argv[0]
    dry = os.environ.get("PEER_DRY_RUN") == "1"
    build = setup_paths()
    ops = setup_gsplat_ops(dry)
    print(f"gsplat_peer: gsplat CUDA ops: {ops}")
    stub_lpips()
    reset = os.environ.get("PEER_RESET") == "1"
    if reset and strategy != "default":
        die("PEER_RESET=1 repairs DefaultStrategy's opacity reset; MCMCStrategy has none (run it without PEER_RESET)")
    if reset:
        patch_opacity_reset()
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        if "--disable_video" not in argv:
            argv.append("--disable_video")
            STUBS.append("--disable_video added (no imageio-ffmpeg: the trajectory video cannot be written)")
    data_dir = arg_value(argv, "--data_dir")
    result_dir = arg_value(argv, "--result_dir")
    if data_dir is None or result_dir is None:
        die("give --data_dir and --result_dir (gsplat's defaults are its own data/ and results/ folders)")
    if not Path(data_dir).is_dir():
        die(f"--data_dir {data_dir}: not a folder")
    patch_split(Path(data_dir))
    for s in STUBS:
        print(f"gsplat_peer: stubbed: {s}")
    print("gsplat_peer: split: gsplat's Dataset indices come from test.txt/train.txt when the capture has them")

    if dry:
        dry_run(argv)
        print(f"gsplat_peer: dry run split: {json.dumps(SPLIT)}")
        return 0

    import shutil

    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not build.get("standin"):
        die("gsplat's trainer needs a CUDA GPU (PEER_DRY_RUN=1 checks the setup without one; a stand-in peer, "
            "write_standin, checks the probe's plumbing)")
    probe = StepProbe.from_env() if os.environ.get("PEER_PROBE") else None
    if probe is not None:
        probe.install()
    # Stats of an earlier run in the same folder (a warm machine) must not be read as this one's.
    shutil.rmtree(Path(result_dir) / "stats", ignore_errors=True)
    own_argv = list(sys.argv)
    sys.argv = [str(PEER / "examples" / "simple_trainer.py")] + argv
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    runpy.run_path(sys.argv[0], run_name="__main__")  # gsplat's own __main__: tyro CLI, cli(main, cfg)
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    sys.argv = own_argv  # the JSON's "command" is this driver's
    if probe is not None:
        out = probe.result()
        out.update(gsplat_args=argv, gsplat_ops=ops, stubbed=STUBS, split=SPLIT, wall_seconds=round(wall, 2),
                   peer=str(PEER), standin=bool(build.get("standin")))
        Path(os.environ["PEER_PROBE"]).write_text(json.dumps(out, indent=1) + "\n")
        print(f"gsplat_peer: probe: {probe.summary()} -> {os.environ['PEER_PROBE']}")
        return 0

    import gsplat
    from benchmarks.common import write_result

    stats = gsplat_stats(Path(result_dir))
    vals = [v for k, v in sorted(stats.items()) if k.startswith("val_step")]
    trains = [v for k, v in sorted(stats.items()) if k.startswith("train_step")]
    last_val, last_train = (vals[-1] if vals else {}), (trains[-1] if trains else {})
    payload = {
        "what": "gsplat 1.5.3's own examples/simple_trainer.py (the peer reference), run by benchmarks/gsplat_peer.py",
        "strategy": strategy,
        "opacity_reset": ("repaired: every reset_every steps, as distsplat (PEER_RESET=1)" if reset else
                          "as released: gsplat 1.5.3's DefaultStrategy never resets (its condition is never true)"),
        "gsplat_args": argv,
        "gsplat_version": gsplat.__version__,
        "gsplat_ops": ops,
        "peer_build": build.get("sources"),
        "stubbed": STUBS,
        "split": SPLIT,
        "summary": {
            "psnr": last_val.get("psnr"), "ssim": last_val.get("ssim"), "lpips": last_val.get("lpips"),
            "num_GS": last_val.get("num_GS", last_train.get("num_GS")),
            "train_seconds": last_train.get("ellipse_time"),  # gsplat: training loop to the last step, before eval
            "eval_seconds_per_image": last_val.get("ellipse_time"),
            "peak_mem_allocated_GiB": last_train.get("mem"),  # gsplat: max_memory_allocated at the last step
            "peak_mem_reserved_GiB": torch.cuda.max_memory_reserved() / 2**30,
            "wall_seconds": round(wall, 2),  # the whole run: parsing, loading, training, eval, saving
        },
        "definitions": {
            "psnr, ssim": "gsplat's eval at the last step: torchmetrics PSNR/SSIM (data_range 1) averaged over the test images",
            "train_seconds": "gsplat's train_step*_rank0.json ellipse_time: its training loop (data loading included), "
                             "from the first step to the last, before the final eval",
            "peak_mem_allocated_GiB": "gsplat's train_step*_rank0.json mem: torch.cuda.max_memory_allocated at the last step",
            "wall_seconds": "this driver: gsplat's whole __main__ (parse, load, train, eval, checkpoint)",
        },
        "gsplat_stats": stats,
    }
    path = write_result(f"gsplat_peer_{strategy}" + ("_reset" if reset else ""), payload)
    print(f"gsplat_peer: {json.dumps(payload['summary'])}")
    print(f"gsplat_peer: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
