"""Determinism (issue 9, part 4; docs/determinism.md): the real CLI under torchrun, run
twice with the same seed and W, gives bit-identical metrics, PLY and checkpoint tensors,
with densification that draws random numbers (the default strategy's splits, from a hash
of (seed, step, Gaussian id); MCMC's relocation and noise, from the rank's stream). Across W the tolerance is the one test_trainer.py checks (the
same global batches give the same parameters); the CLI draws other batches on another
W, and the bound below holds the measured difference of the final metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest
import torch

from torchrun_cli import checkpoint_tensors, torchrun

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)

SCENE = ["--synthetic.kind", "ball", "--synthetic.num_cameras", "12", "--synthetic.num_gaussians", "400", "--synthetic.width", "32",
         "--synthetic.height", "24", "--sh_degree", "1", "--prefetch", "1", "--disable_viewer"]
STEPS = 40
RUNS = {
    # 2 decode threads: the loader's thread order must not matter either
    "default": ["default", "--num_workers", "2", "--strategy.refine_start_iter", "10",
                "--strategy.refine_every", "5", "--strategy.refine_stop_iter", "26",
                "--strategy.grow_grad2d", "2e-4", "--strategy.reset_every", "20"],  # 400 -> ~1600
    "mcmc": ["mcmc", "--num_workers", "1", "--strategy.refine_start_iter", "5", "--strategy.refine_every", "5",
             "--strategy.cap_max", "600", "--opacity_reg", "0.01", "--scale_reg", "0.01"],
}


def train(out: Path, strategy_args: List[str], nproc: int = 2, extra=()) -> None:
    p = torchrun([*strategy_args, "--max_steps", str(STEPS), "--eval_steps", "20", str(STEPS),
                  "--save_steps", str(STEPS), "--result_dir", str(out), *SCENE, *extra], nproc=nproc)
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(RUNS))
def test_same_seed_and_world_size_give_bit_identical_results(tmp_path, strategy):
    a, b = tmp_path / "a", tmp_path / "b"
    train(a, RUNS[strategy])
    train(b, RUNS[strategy])
    for step in (20, STEPS):
        sa, sb = (json.loads((r / "stats" / f"val_step{step:04d}.json").read_text()) for r in (a, b))
        for key in ("psnr", "ssim", "num_GS"):
            assert sa[key] == sb[key], (step, key, sa[key], sb[key])  # exact: same floats
    assert sa["num_GS"] != 400  # densification ran (and drew random numbers)
    ply = f"ply/point_cloud_{STEPS:04d}.ply"
    assert (a / ply).read_bytes() == (b / ply).read_bytes()
    ta, tb = checkpoint_tensors(a / "ckpts" / f"step_{STEPS:06d}"), checkpoint_tensors(b / "ckpts" / f"step_{STEPS:06d}")
    assert ta.keys() == tb.keys() and len(ta) > 20
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


@pytest.mark.slow
def test_other_world_size_same_global_batch_stays_within_the_documented_bound(tmp_path):
    # W=1 x 2 cameras vs W=2 x 1 camera: the same global batch size, but the batcher
    # draws other batches on another W, so the metrics differ by training noise, not
    # rounding; another CPU rounds differently and draws another sample of that noise.
    # Over seeds 0-4 (benchmarks/results/cross_w_seeds_cpu2_2026-11-23.json) |dPSNR| has an RMS of
    # 0.024 dB (max 0.040) and |dSSIM| 2.2e-4 (max 3.8e-4): the bounds are 4 and 9 RMS.
    # A rank's lost gradient or a mis-owned camera costs whole dB (the seed alone moves
    # PSNR by 0.17 dB; training adds ~2.5 dB here).
    flags = ["default", "--max_steps", "120", "--eval_steps", "120", "--save_steps", "120",
             *SCENE, "--num_workers", "1", "--seed", "0"]
    stats = []
    for w in (1, 2):
        p = torchrun([*flags, "--batch_size", str(2 // w), "--result_dir", str(tmp_path / f"w{w}")], nproc=w)
        assert p.returncode == 0, p.stderr[-3000:]
        stats.append(json.loads((tmp_path / f"w{w}" / "stats" / "val_step0120.json").read_text()))
    one, two = stats
    assert abs(one["psnr"] - two["psnr"]) < 0.1, (one["psnr"], two["psnr"])
    assert abs(one["ssim"] - two["ssim"]) < 2e-3, (one["ssim"], two["ssim"])
    assert one["psnr"] > 22.5 and two["psnr"] > 22.5  # both trained (about 21 dB at the start)
