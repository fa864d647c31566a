"""The training extras of issue 18 in the Trainer on gloo CPU ranks: W = 1, 2, 3 on the
same global batches (W=3's; W=1 and W=2 replay them, trainer_workers.ReplayTrainer) end
with the same Gaussians, as test_trainer.py's densification test checks for plain
training; and each extra changes training the way gsplat's does."""

from __future__ import annotations

import json

import pytest
import torch

from test_trainer import _by_id, densify_config
from trainer_workers import tiny_config

# gsplat's learning rates x sqrt(global batch 3), the size of one Adam step.
LRS = {"means": 1.6e-4 * 3**0.5, "scales": 5e-3 * 3**0.5, "quats": 1e-3 * 3**0.5, "opacities": 5e-2 * 3**0.5,
       "sh0": 2.5e-3 * 3**0.5, "shN": 2.5e-3 / 20 * 3**0.5}


def run_w123(run_workers, tmp_path, tweak, **overrides):
    """W=1, 2, 3 runs of densify_config(**overrides), changed by tweak(cfg), in float64 on
    W=3's batches."""
    def cfg(W, batch_size):
        c = densify_config(str(tmp_path / f"w{W}"), batch_size, **overrides)
        tweak(c)
        return c

    return {
        1: run_workers("trainer_workers:train", 1, cfg(1, 3), 3, True),
        2: run_workers("trainer_workers:train", 2, cfg(2, 1), 3, True),
        3: run_workers("trainer_workers:train", 3, cfg(3, 1), 0, True),
    }


def assert_same_gaussians(runs, outliers: float = 0.0):
    """The same events and ids; parameters within test_trainer.py's densification bounds
    (typical Gaussian within 1e-4 Adam step, none beyond 0.1 step: see its comments), but
    for a fraction `outliers` of the Gaussians, which must stay within 2 steps.

    Why outliers: when the events and ids agree, an extra that only steers densification
    (absgrad) cannot move parameters by itself; what W changes is what test_trainer.py
    names, notably the renderer's tie-break of equal float32 depths by global order, which
    after densification depends on W. With more Gaussians there are more such pairs: a
    run of 3300 Gaussians had 4 beyond 0.1 step at W=3 (max 1.1 step), none at W=2."""
    events = {W: {k: sum(r["events"][k] for r in rs) for k in ("dupli", "split", "prune")} for W, rs in runs.items()}
    assert min(r["events"]["margin"] for rs in runs.values() for r in rs) > 1e-6
    uid1, p1 = _by_id(runs[1])
    for W in (2, 3):
        assert events[W] == events[1], (W, events)
        uid, p = _by_id(runs[W])
        assert torch.equal(uid, uid1), W
        for k, v in p1.items():
            d = (p[k] - v).abs().reshape(len(uid), -1).amax(1) / LRS[k]  # [N] in Adam steps
            assert d.median() < 1e-4, (W, k, d.median())
            assert (d > 0.1).sum() <= outliers * len(d) and d.max() < 2.0, (W, k, int((d > 0.1).sum()), d.max())
    return events[1]


@pytest.mark.slow  # 6 processes, 20 float64 steps each (test_trainer's densification test's size)
def test_absgrad_densification_is_w_invariant(run_workers, tmp_path):
    def absgrad(cfg):
        # Absolute gradients are ~4x the summed ones here: a threshold 3x densify_config's
        # keeps the growth near that test's (at 1e-3, 3300 Gaussians: more exact depth ties).
        cfg.strategy.absgrad, cfg.strategy.grow_grad2d = True, 3e-3

    events = assert_same_gaussians(run_w123(run_workers, tmp_path, absgrad), outliers=0.005)
    assert events["dupli"] + events["split"] > 50, events


def test_absgrad_densifies_more_at_the_same_threshold(run_workers, tmp_path):
    """gsplat's claim for AbsGS: |per-pixel gradients| summed do not cancel, so more
    Gaussians pass the same grow_grad2d (set after validate(), which would raise it for absgrad)."""
    from distsplat.train.strategies import DefaultStrategy

    counts = {}
    for absgrad in (False, True):
        cfg = tiny_config(str(tmp_path / f"a{absgrad}"), max_steps=20, strategy=DefaultStrategy(
            refine_start_iter=5, refine_every=5, refine_stop_iter=1000, reset_every=10_000,
            absgrad=absgrad))
        # after validate(), which would raise absgrad's default; high enough that plain
        # gradients do not pass it everywhere (at 2e-4 both runs grew 400 -> ~5000 in 30 steps)
        cfg.strategy.grow_grad2d = 1e-3
        counts[absgrad] = run_workers("extras_workers:train_count", 2, cfg)[0]["n"]
    assert counts[True] > 1.2 * counts[False] and counts[False] >= 400, counts


def test_absgrad_raises_gsplat_default_threshold():
    from distsplat.train.strategies import DefaultStrategy

    cfg = tiny_config("unused", strategy=DefaultStrategy(absgrad=True))
    assert cfg.strategy.grow_grad2d == 0.0008
    cfg = tiny_config("unused", strategy=DefaultStrategy(absgrad=True, grow_grad2d=0.0005))
    assert cfg.strategy.grow_grad2d == 0.0005


@pytest.mark.slow  # 6 processes, 20 float64 steps each (test_trainer's densification test's size)
def test_depth_loss_training_is_w_invariant(run_workers, tmp_path):
    """--depth_loss on the built-in scene (no tracks: every point in the image is a target)."""
    runs = run_w123(run_workers, tmp_path, lambda c: setattr(c, "depth_loss", True))
    # Outliers as for absgrad (measured: 2 of 1628 Gaussians at 0.28 step at W=2); a depth
    # term on the wrong camera or rank moves most Gaussians by steps, failing the median.
    assert_same_gaussians(runs, outliers=0.005)


@pytest.mark.slow  # 6 processes, 20 float64 steps each (test_trainer's densification test's size)
def test_pose_opt_training_is_w_invariant_and_identical_on_every_rank(run_workers, tmp_path):
    """--pose_opt with --pose_noise: the corrections are bitwise identical on every rank,
    and equal across W (float64; a correction's gradient sums every rank's pairs)."""
    def pose(cfg):
        cfg.pose_opt, cfg.pose_noise, cfg.pose_opt_lr = True, 0.01, 1e-3

    runs = run_w123(run_workers, tmp_path, pose, save_steps=[20])
    assert_same_gaussians(runs)
    for W, rs in runs.items():
        for r in rs[1:]:
            assert torch.equal(r["pose"], rs[0]["pose"]), W  # every rank's copy, bitwise
    moved = runs[1][0]["pose"].abs().max()
    assert moved > 1e-3, moved  # the corrections trained
    for W in (2, 3):
        # In Adam steps (lr 1e-3 x sqrt(3)): a camera's gradient sums every Gaussian's pairs,
        # and the Gaussians agree to ~1e-4 step (above), so the corrections can differ by
        # that much (measured: 8.5e-5 step); a lost rank's share moves them by ~1 step.
        torch.testing.assert_close(runs[W][0]["pose"], runs[1][0]["pose"], rtol=0, atol=1e-3 * 1.7e-3)
    # W=2's checkpoint resumes on W=3 with its corrections (and their Adam state: the next
    # step matches; here the values) on every rank.
    cfg = densify_config(str(tmp_path / "r3"), 1, ckpt=str(tmp_path / "w2" / "ckpts"))
    pose(cfg)
    resumed = run_workers("trainer_workers:resume", 3, cfg)
    for r in resumed:
        assert torch.equal(r["pose"], runs[2][0]["pose"])


@pytest.mark.slow
def test_cli_two_ranks_with_every_extra(tmp_path):
    """absgrad, depth loss, pose and appearance optimization together through the real CLI
    under torchrun with 2 CPU ranks, to a checkpoint that resumes with them."""
    from torchrun_cli import TINY_FLAGS, torchrun

    extras = ["--strategy.absgrad", "--depth_loss", "--pose_opt", "--pose_noise", "0.01", "--app_opt",
              "--strategy.refine_start_iter", "10", "--strategy.refine_every", "10"]
    out = tmp_path / "run"
    p = torchrun(["default", "--max_steps", "30", "--eval_steps", "30", "--save_steps", "30",
                  "--result_dir", str(out), *TINY_FLAGS, *extras])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "final: PSNR" in p.stdout
    cfg = json.loads((out / "ckpts" / "step_000030" / "meta.json").read_text())["state"]["config"]  # = cfg.yml's
    assert cfg["strategy"]["grow_grad2d"] == 0.0008 and cfg["depth_loss"] and cfg["pose_opt"] and cfg["app_opt"]
    shard = torch.load(sorted((out / "ckpts" / "step_000030").glob("*.pt"))[0], weights_only=True)  # rank 0's
    assert shard["pose_opt"]["deltas"].abs().max() > 0  # trained corrections in the checkpoint
    assert shard["app_opt"]["embeds"].shape == (10, 16) and shard["app_opt"]["mlp"]["4.bias"].abs().max() > 0
    from distsplat.train.export import ply_fields
    from distsplat.viewer.model import read_ply_header

    _, names, _ = read_ply_header(out / "ply" / "point_cloud_0030.ply")
    assert names == ply_fields(0)  # the standard layout, colours baked into the DC term (as gsplat)
    # The viewer shows the checkpoint with the same baked colours as the PLY.
    from distsplat.distributed import DistContext
    from distsplat.viewer.model import load_model, read_ply_chunk

    model = load_model(str(out / "ckpts"), DistContext(rank=0, world_size=1, local_rank=0,
                                                       device=torch.device("cpu"), backend=None))
    ply, _ = read_ply_chunk(out / "ply" / "point_cloud_0030.ply", 0, 1)
    assert model.sh_degree == 0
    # float32 PLY records of the same float32 bake: equal to float32 rounding of sh0 (|sh0| < 2)
    torch.testing.assert_close(model.params["sh0"].float(), ply["sh0"], rtol=0, atol=1e-6)
    p = torchrun(["default", "--max_steps", "40", "--eval_steps", "40", "--save_steps", "40",
                  "--ckpt", str(out / "ckpts"), "--result_dir", str(tmp_path / "resumed"), *TINY_FLAGS, *extras])
    assert p.returncode == 0, p.stderr[-3000:]


APP_LRS = {"features": 2.5e-3 * 3**0.5, "colors": 2.5e-3 * 3**0.5}  # gsplat's sh0 lr for both


def app_opt(cfg):
    # lr 1e-2 (gsplat's 1e-3 x 10): in 20 steps the MLP's zero last layer moves well off zero.
    cfg.app_opt, cfg.app_opt_lr = True, 1e-2


def embed_table(results):
    """Every image's embedding [n_train, D], each from its owner rank (exactly one)."""
    rows = torch.stack([r["app"]["embeds"] for r in results])  # [W, n_train, D], NaN off the owner
    assert ((~rows.isnan()).sum(0) == 1).all()
    return rows.nan_to_num(0.0).sum(0)


def assert_same_appearance(runs, lr: float):
    """Every rank's MLP bitwise identical (a bug there is caught at once)."""
    for W, rs in runs.items():
        for r in rs[1:]:
            assert torch.equal(r["app"]["mlp"], rs[0]["app"]["mlp"]), W
    assert_appearance_across_w(runs, lr)


def assert_appearance_across_w(runs, lr: float):
    """The MLP (rank 0's) and every image's embedding (from its owner) equal across W.
    Tolerance in Adam steps (lr x sqrt(3)), as pose_opt's: the MLP's gradient sums every
    pair of the batch and the Gaussians feeding it agree to ~1e-4 step
    (assert_same_gaussians), so the MLP may differ by ~1e-3 step (measured: 6e-5 step at W=2,
    4e-5 at W=3; embeddings 1e-5); a rank's share of the gradient missing (no all-reduce)
    moves it by whole steps (measured: 15 steps, the embeddings 10)."""
    mlp1, table1 = runs[1][0]["app"]["mlp"], embed_table(runs[1])
    assert mlp1[-3:].abs().max() > 2 * lr * 3**0.5, mlp1[-3:]  # the last layer's bias: > 2 Adam steps off zero
    for W in runs:
        if W != 1:
            torch.testing.assert_close(runs[W][0]["app"]["mlp"], mlp1, rtol=0, atol=1e-3 * lr * 3**0.5)
            torch.testing.assert_close(embed_table(runs[W]), table1, rtol=0, atol=1e-3 * 10 * lr * 3**0.5)


@pytest.mark.slow  # 6 processes, 20 float64 steps each (test_trainer's densification test's size)
def test_app_opt_training_is_w_invariant_and_identical_on_every_rank(run_workers, tmp_path, monkeypatch):
    """--app_opt: W = 1, 2, 3 on the same batches give the same Gaussians (features and
    colours included), the same MLP (bitwise on every rank) and the same embeddings (each
    on its owner); W=2's checkpoint resumes on W=3 with the same embeddings and MLP."""
    monkeypatch.setitem(LRS, "features", APP_LRS["features"])
    monkeypatch.setitem(LRS, "colors", APP_LRS["colors"])
    runs = run_w123(run_workers, tmp_path, app_opt, save_steps=[20])
    assert "features" in runs[1][0]["params"] and "sh0" not in runs[1][0]["params"]
    assert_same_gaussians(runs)
    assert_same_appearance(runs, 1e-2)
    cfg = densify_config(str(tmp_path / "r3"), 1, ckpt=str(tmp_path / "w2" / "ckpts"))
    app_opt(cfg)
    resumed = run_workers("trainer_workers:resume", 3, cfg)
    assert torch.equal(embed_table(resumed), embed_table(runs[2]))  # W=2's rows, now on W=3's owners, exactly
    for r in resumed:
        assert torch.equal(r["app"]["mlp"], runs[2][0]["app"]["mlp"])


@pytest.mark.slow  # 3 processes
def test_app_opt_invariance_check_fails_without_the_mlp_all_reduce(run_workers, tmp_path, monkeypatch):
    """The mutation check of the test above: W=2 with each rank stepping on its own share
    of the MLP's gradient (the all-reduce replaced by the identity) must fail it."""
    monkeypatch.setitem(LRS, "features", APP_LRS["features"])
    monkeypatch.setitem(LRS, "colors", APP_LRS["colors"])

    def cfg(W, batch_size, **kw):
        c = densify_config(str(tmp_path / f"w{W}"), batch_size, **kw)
        app_opt(c)
        return c

    runs = {1: run_workers("trainer_workers:train", 1, cfg(1, 3), 3, True),
            2: run_workers("trainer_workers:train", 2, cfg(2, 1), 3, True, False, -1, 0.0, True)}  # no_app_all_reduce
    assert not torch.equal(runs[2][0]["app"]["mlp"], runs[2][1]["app"]["mlp"])  # the copies drift apart
    with pytest.raises(AssertionError):
        assert_appearance_across_w(runs, 1e-2)  # and rank 0's leaves W=1's
