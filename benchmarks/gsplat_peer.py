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
   opacities; distsplat's DefaultStrategy (distsplat/train/strategies.py) does, every
   `reset_every` steps before `refine_stop_iter`. PEER_RESET=1 adds that reset after gsplat's
   own step_post_backward (gsplat's `reset_opa`, the value its code intends), so the two
   trainers run the same schedule; the result is gsplat_peer_<strategy>_reset.json. Without
   it the peer is gsplat exactly as released (gsplat_peer_<strategy>.json).

Usage (device, repo root, after installing .whl; see scripts/prepare_gsplat_peer.sh):
    python3 benchmarks/gsplat_peer.py default --data_dir .gpu_data/thermos --data_factor 1 \
        --max_steps 7000 --eval_steps 7000 --save_steps 7000 --disable_viewer --result_dir /tmp/peer_default
Everything after the script name is gsplat's simple_trainer CLI, unchanged. Both strategies in
one device call, carry [".whl", ".gpu_data", ".gsplat_ext", ".gsplat_peer"] (scripts/gpu_prepare.sh
makes them): install the wheels as scripts/gpu_validate.sh does, export PYTHONPATH=/tmp/site:$PWD,
then `for s in default mcmc; do python3 benchmarks/gsplat_peer.py $s ... --result_dir /tmp/peer_$s; done`
and copy benchmarks/results/gsplat_peer_*.json to $OUT. Environment:
GSPLAT_PEER (the peer folder, default <repo>/.gsplat_peer), DISTSPLAT_GSPLAT_EXT (default
<repo>/.gsplat_ext), DISTSPLAT_COMMIT (else .gpu_data/COMMIT, else git), PEER_DRY_RUN=1 (no
CUDA: set everything up, parse the arguments, build gsplat's Parser and Datasets, load one
image, print the split; training is not run), PEER_RESET=1 (point 5 above).
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
    distsplat.train.strategies.reset_opacities_if_due (gsplat's reset_opa at 0 < step <
    refine_stop_iter, step a multiple of reset_every)."""
    from distsplat.train.strategies import reset_opacities_if_due

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

    # Stats of an earlier run in the same folder (a warm machine) must not be read as this one's.
    shutil.rmtree(Path(result_dir) / "stats", ignore_errors=True)
    own_argv = list(sys.argv)
    sys.argv = [str(PEER / "examples" / "simple_trainer.py")] + argv
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    runpy.run_path(sys.argv[0], run_name="__main__")  # gsplat's own __main__: tyro CLI, cli(main, cfg)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    sys.argv = own_argv  # the JSON's "command" is this driver's

    import gsplat
    from benchmarks.common import write_result

    if not os.environ.get("DISTSPLAT_COMMIT") and (REPO / ".gpu_data" / "COMMIT").is_file():
        os.environ["DISTSPLAT_COMMIT"] = (REPO / ".gpu_data" / "COMMIT").read_text().strip()
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
