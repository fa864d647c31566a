"""Mixed image sizes in one scene (issue 16) on gloo CPU ranks: a COLMAP capture with two
PINHOLE cameras of different sizes and aspects (40x30 and 24x32), trained with batches of
4 cameras (W=1: 4 own cameras; W=2: 2 each), so steps mix sizes, several cameras share a
size, and a rank may own no camera of a size. W=1 and W=2 on the same global batches
(train/model/size_groups.py: one render per size, the same calls on every rank) end with the same
Gaussians through densification, and evaluate the mixed-size test cameras alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distsplat.distributed import CameraBatcher
from rounding import assert_decisions_clear, by_id, rounding_bound_by_id
from test_trainer import ANISO, densify_config
from tests.unit.data_helpers import make_mixed_size_colmap

SIZES = ((40, 30), (24, 32))  # (w, h) of COLMAP cameras 1 and 2, dealt to the images round robin
NUM_CAMERAS, TEST_EVERY, SHARDS = 12, 3, 4  # test cameras 0, 3, 6, 9: both sizes
# The longest sum behind a Gaussian's gradient: every pixel of a batch of 4 cameras of the larger size
N_ACC_MIXED = 4 * max(w * h for w, h in SIZES)


def _config(root, result_dir, batch_size):
    # The SfM points in the capture's order (--balance_pairs deals them in a seeded shuffle, the
    # same on every W: test_trainer.py's densification test runs with it on).
    return densify_config(str(result_dir), batch_size, data_dir=str(root), data_factor=1, test_every=TEST_EVERY,
                          init_type="sfm", balance_pairs=False)


def _batches_mix_sizes(steps: int) -> None:
    """The replayed batches (4 shards of one camera, tiny_config's seed 3) do mix sizes,
    with a size some W=2 rank owns no camera of: the test covers what it claims."""
    train = [i for i in range(NUM_CAMERAS) if i % TEST_EVERY != 0]  # COLMAP's split: every 3rd is a test image
    b = CameraBatcher(len(train), SHARDS, 1, seed=3)
    mixed = lonely = 0
    for s in range(steps):
        batch = b.batch(s // b.steps_per_epoch, s % b.steps_per_epoch)
        sizes = [SIZES[train[c] % 2] for c in batch.cameras.tolist()]  # [4] in batch order
        mixed += len(set(sizes)) > 1
        lonely += set(sizes[:2]) != set(sizes) or set(sizes[2:]) != set(sizes)  # W=2: rank 0 owns [0, 1]
    assert mixed >= steps // 2 and lonely >= 1, (mixed, lonely)


@pytest.mark.numerics
@pytest.mark.slow  # 3 processes, 20 float64 steps with densification (~35 s on 2 shared cores)
def test_mixed_size_training_is_w_invariant(run_workers, tmp_path):
    root = make_mixed_size_colmap(tmp_path / "capture", SIZES, num_cameras=NUM_CAMERAS)
    _batches_mix_sizes(20)
    runs = {  # float64 from test_trainer's anisotropic start, W=1's Adam steps recorded
        1: run_workers("trainer_workers:train", 1, _config(root, tmp_path / "w1", 4), SHARDS, True, True, -1, ANISO),
        2: run_workers("trainer_workers:train", 2, _config(root, tmp_path / "w2", 2), SHARDS, True, False, -1, ANISO),
    }
    # As test_trainer.py's densification test: every decision on the same side of its
    # threshold (measured), the same events and ids, every parameter within its rounding bound.
    assert_decisions_clear(runs)
    events = {W: {k: sum(r["events"][k] for r in rs) for k in ("dupli", "split", "prune")} for W, rs in runs.items()}
    assert events[2] == events[1], events
    assert events[1]["dupli"] + events[1]["split"] > 20, events  # the merged densification meta is exercised
    uid1, p1 = by_id(runs[1])
    uid2, p2 = by_id(runs[2])
    assert torch.equal(uid1, uid2)
    one = runs[1][0]
    _, bound = by_id(runs[1], {k: [v] for k, v in rounding_bound_by_id(one, N_ACC_MIXED, one["seed"]).items()})
    excess = {k: ((p2[k] - v).abs() / bound[k]).max().item() for k, v in p1.items()}
    assert all(e <= 1.0 for e in excess.values()), f"max difference / rounding bound: {excess}"
    # The evaluation (each test camera at its own size) agrees: float32 renders of float64
    # parameters within their rounding bound, PSNRs within 1e-3 dB.
    m1, m2 = runs[1][0]["metrics"], runs[2][0]["metrics"]
    assert np.isfinite(m1["val_psnr"]) and m1["val_psnr"] > 15, m1
    assert abs(m1["val_psnr"] - m2["val_psnr"]) < 1e-3, (m1["val_psnr"], m2["val_psnr"])
    assert abs(m1["val_ssim"] - m2["val_ssim"]) < 1e-4, (m1["val_ssim"], m2["val_ssim"])


# Two COLMAP cameras of different models and sizes: SIMPLE_RADIAL 64x48 (undistorted on
# load to a 63x47 pinhole crop) and a portrait PINHOLE 48x64.
TWO_CAMERAS = [("SIMPLE_RADIAL", [60.0, 32.3, 23.8, -0.06], 64, 48), ("PINHOLE", [45.0, 45.0, 24.0, 32.0], 48, 64)]
CLI_STEPS = 60


@pytest.mark.slow  # the real CLI under torchrun, 2 ranks, ~35 s on 2 shared cores
def test_two_camera_mixed_size_capture_trains_from_the_cli(tmp_path):
    pytest.importorskip("pycolmap", reason="pycolmap (dev extra) makes the distorted images")
    import json
    import os

    from tests.unit.data_helpers import make_distorted_colmap
    from torchrun_cli import torchrun

    data = make_distorted_colmap(tmp_path / "capture", TWO_CAMERAS, num_cameras=12)
    out = tmp_path / "run"
    # --test_every 3: test images 0, 3, 6, 9 of both cameras; --batch_size 2: 4 cameras a step
    p = torchrun(["default", "--data_dir", str(data), "--data_factor", "1", "--result_dir", str(out),
                  "--max_steps", str(CLI_STEPS), "--eval_steps", "10", str(CLI_STEPS), "--sh_degree", "1",
                  "--test_every", "3", "--batch_size", "2", "--num_workers", "1", "--prefetch", "1",
                  "--disable_viewer"], timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "cameras at 48x64, 63x47" in p.stderr, p.stderr[-2000:]  # both sizes, each its own
    early = json.loads((out / "stats" / "val_step0010.json").read_text())
    final = json.loads((out / "stats" / f"val_step{CLI_STEPS:04d}.json").read_text())
    log = os.environ.get("DISTSPLAT_CAPTURES_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"capture": "mixed_sizes", "early_psnr": early["psnr"], "final_psnr": final["psnr"],
                                "num_GS": final["num_GS"]}) + "\n")
    # As test_captures.py: initialised at the ground truth's centres, training must raise
    # the held-out PSNR of both sizes' test images.
    assert final["num_test_images"] == 4
    assert final["psnr"] > early["psnr"] + 0.5, (early["psnr"], final["psnr"])
