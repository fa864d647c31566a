"""The trainer on gloo CPU ranks: W-invariance of training, both densification strategies,
rebalancing, resuming on other world sizes, and the real CLI under torchrun (end to end,
kill and resume: test_checkpoint_faults.py; bad inputs: test_bad_input_catalog.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from torchrun_cli import TINY_FLAGS, torchrun
from trainer_workers import mcmc_config, tiny_config
from rounding import assert_decisions_clear, by_id, rounding_bound, rounding_bound_by_id

ANISO = 0.3  # see trainer_workers.to_float64: no quaternion with a structurally zero gradient
# The longest sum behind one gradient component: every pixel of the batch's cameras
# (tiny_config: 32 x 24 images; global batch 2 here, 3 in the densification runs). rounding.py
# derives the bound these tests hold training to.
N_ACC = 2 * 32 * 24
N_ACC_3 = 3 * 32 * 24
# The W-invariance runs replay one global batch sequence on every W (trainer_workers.ReplayTrainer).
# --balance_cameras reorders each epoch by the cameras' measured costs at W > 1 only, so it is off
# here; its own invariants: tests/unit/test_batcher.py, test_balance.py (issue 33).
SAME_BATCHES = {"balance_cameras": False}


def excess_over_rounding(one: dict, two: list) -> dict:
    """max |W=2 - W=1| / rounding bound per parameter (rounding.py): <= 1 means rounding explains it."""
    out = {}
    for k, v in one["params"].items():
        got = torch.cat([r["params"][k] for r in two])
        out[k] = ((got - v).abs() / rounding_bound(one["adam"][k], v, N_ACC)).max().item()
    return out


@pytest.fixture(scope="module")
def w1_reference(run_workers, tmp_path_factory):
    out = tmp_path_factory.mktemp("w1")
    cfg = tiny_config(str(out / "w1"), batch_size=2, eval_steps=[20], **SAME_BATCHES)
    # replays W=2's global batches; float64, anisotropic scales, Adam recorded
    (one,) = run_workers("trainer_workers:train", 1, cfg, 2, True, True, -1, ANISO)
    return one


@pytest.mark.numerics
def test_w1_and_w2_training_give_the_same_parameters_and_metrics(run_workers, w1_reference, tmp_path):
    one = w1_reference
    cfg2 = tiny_config(str(tmp_path / "w2"), batch_size=1, eval_steps=[20], **SAME_BATCHES)
    two = run_workers("trainer_workers:train", 2, cfg2, 0, True, False, -1, ANISO)
    start = run_workers("trainer_workers:train", 1, tiny_config(str(tmp_path / "w0"), max_steps=1), 0, True,
                        False, -1, ANISO)[0]  # after one step, from the same anisotropic start
    excess = excess_over_rounding(one, two)
    assert all(e <= 1.0 for e in excess.values()), excess
    moved = sum(int((v - start["params"][k]).abs().max() > 1e-3) for k, v in one["params"].items())
    assert moved == len(one["params"])  # everything trained (shN too: SH degree 1 from step 10)
    # Renders of parameters that agree to rounding_bound (<= ~1e-13 outside Adam's noise
    # components, whose Gaussians barely touch the image): a pixel composites <= 400
    # Gaussians (400 u = 4e-14) and moves by <= ~30 px per unit of a mean (focal / depth),
    # so ~1e-11; 1e-9 leaves room. A lost or mis-routed gradient moves them by >= 1e-3.
    torch.testing.assert_close(one["render"], two[0]["render"], atol=1e-9, rtol=0)
    # PSNR = -10 log10(mse): d PSNR = 4.34 d mse / mse <= 4.34 * 2 * 1e-9 / 1e-3 ~ 1e-5 dB at
    # mse ~ 1e-3. SSIM moves by <= |dSSIM/dpixel| * 1e-9 with |dSSIM/dpixel| <= 1 / C2 = 1.1e3.
    assert one["metrics"]["val_psnr"] == pytest.approx(two[0]["metrics"]["val_psnr"], abs=1e-5)
    assert one["metrics"]["val_ssim"] == pytest.approx(two[0]["metrics"]["val_ssim"], abs=1e-6)


@pytest.mark.numerics
def test_w_invariance_check_catches_a_dropped_gradient(run_workers, w1_reference, tmp_path):
    """The check above can fail: rank 1 zeroing its gradients (a lost reverse exchange)."""
    cfg2 = tiny_config(str(tmp_path / "w2"), batch_size=1, eval_steps=[20], **SAME_BATCHES)
    two = run_workers("trainer_workers:train", 2, cfg2, 0, True, False, 1, ANISO)
    excess = excess_over_rounding(w1_reference, two)
    assert all(e > 1e3 for e in excess.values()), excess


def test_default_strategy_densifies_on_every_rank(run_workers, tmp_path):
    from distsplat.train.model.strategies import DefaultStrategy

    cfg = tiny_config(str(tmp_path / "d"), max_steps=25, strategy=DefaultStrategy(
        refine_start_iter=5, refine_every=5, refine_stop_iter=1000, reset_every=10_000,
        grow_grad2d=1e-5))
    results = run_workers("trainer_workers:train", 2, cfg)
    counts = results[0]["counts"]
    assert counts == results[1]["counts"] and sum(counts) > 400  # grew from 400
    assert max(counts) <= cfg.rebalance_ratio * min(counts) + 1  # kept balanced
    assert [len(r["params"]["means"]) for r in results] == counts


def densify_config(result_dir: str, batch_size: int, **overrides):
    """20 float64 steps with every densification event: growth at steps 6, 9, 12, 15, 18
    (duplicate and split), pruning of low opacity (prune_opa 0.05, so Gaussians the resets
    at steps 8 and 16 bring to 0.1 can fall below it) and, after the first reset, of too
    big Gaussians."""
    from distsplat.train.model.strategies import DefaultStrategy

    # lr x sqrt(B): the bounds below are in units of that Adam step (the visibility rule's
    # W-invariance is test_w1_and_w2_training_give_the_same_parameters_and_metrics')
    overrides.setdefault("lr_batch_scaling", "sqrt")
    return tiny_config(result_dir, batch_size=batch_size, strategy=DefaultStrategy(
        refine_start_iter=3, refine_every=3, refine_stop_iter=20, reset_every=8, grow_grad2d=1e-3,
        prune_opa=0.05), **{**SAME_BATCHES, **overrides})


def _by_id(results):
    """The Gaussians of all ranks as a set: ids [N_all] ascending and parameters in that order."""
    return by_id(results)


def densify_runs(run_workers, tmp_path, tweak=lambda cfg: None, **overrides):
    """W = 1, 2, 3 on W=3's global batches (W=1 and W=2 replay them) of densify_config(**overrides)
    changed by tweak(cfg): float64, anisotropic start (rounding.py: why), W=1's Adam recorded."""
    def cfg(W, batch_size):
        c = densify_config(str(tmp_path / f"w{W}"), batch_size, **overrides)
        tweak(c)
        return c

    return {
        1: run_workers("trainer_workers:train", 1, cfg(1, 3), 3, True, True, -1, ANISO),
        2: run_workers("trainer_workers:train", 2, cfg(2, 1), 3, True, False, -1, ANISO),
        3: run_workers("trainer_workers:train", 3, cfg(3, 1), 0, True, False, -1, ANISO),
    }


def assert_same_gaussians(runs) -> dict:
    """W = 2 and 3 end with W=1's Gaussians: every grow and prune decision taken on the same
    side of its threshold (measured, rounding.assert_decisions_clear), so the same events and
    ids; and every parameter of every Gaussian within its rounding bound (rounding.py: float64
    summation order amplified by Adam, inherited and carried through splits). Returns W=1's
    event counts and the largest parameter difference over its bound."""
    assert_decisions_clear(runs)
    events = {W: {k: sum(r["events"][k] for r in rs) for k in ("dupli", "split", "prune")} for W, rs in runs.items()}
    one = runs[1][0]
    bound = rounding_bound_by_id(one, N_ACC_3, one["seed"])
    uid1, p1 = _by_id(runs[1])
    _, b1 = by_id(runs[1], {k: [v] for k, v in bound.items()})
    excess = {}
    for W in [W for W in runs if W != 1]:
        assert events[W] == events[1], (W, events)
        uid, p = _by_id(runs[W])
        assert torch.equal(uid, uid1), W  # the same Gaussians were born, split and pruned
        for k, v in p1.items():
            excess[W, k] = ((p[k] - v).abs() / b1[k]).max().item()
    assert all(e <= 1.0 for e in excess.values()), f"(W, parameter): max difference / rounding bound: {excess}"
    return {"events": events[1], "excess": excess}


@pytest.fixture(scope="module")
def densified(run_workers, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("densify")
    return tmp, densify_runs(run_workers, tmp, save_steps=[20])


@pytest.mark.numerics
def test_densification_is_w_invariant(run_workers, densified):
    """W = 1, 2, 3 on the same global batches (W=3's: 3 cameras per step; W=1 and W=2
    replay them) through 5 growths, 2 opacity resets and 5 prunings end with the same
    Gaussians: the same ids (the order differs: each rank appends its newborns) and every
    parameter within its float64 rounding bound (rounding.py). A W=2 checkpoint of the
    result resumes on W=3 with every id in its place."""
    tmp_path, runs = densified
    same = assert_same_gaussians(runs)
    assert all(n > 50 for n in same["events"].values()), same  # every kind of event, many times
    assert len(runs[1][0]["uid"]) > 400
    resumed = run_workers("trainer_workers:resume", 3, densify_config(
        str(tmp_path / "r3"), 1, max_steps=20, ckpt=str(tmp_path / "w2" / "ckpts")))
    assert torch.equal(torch.cat([r["uid"] for r in resumed]), torch.cat([r["uid"] for r in runs[2]]))
    for k in runs[1][0]["params"]:
        assert torch.equal(torch.cat([r["params"][k] for r in resumed]), torch.cat([r["params"][k] for r in runs[2]]))


@pytest.mark.numerics
def test_densification_bound_catches_a_small_gradient_error(run_workers, densified, tmp_path):
    """The check above can fail, and not only on whole-step errors: W=2 with one rank's
    gradients off by a relative 1e-9 per component (a float32 sum would be ~1e-7) fails
    it, though every parameter stays far within the 0.1 Adam step a tolerance allowed."""
    _, runs = densified
    bad = run_workers("trainer_workers:train", 2, densify_config(str(tmp_path / "w2"), 1), 3, True, False, 1, ANISO,
                      False, 1e-9)
    with pytest.raises(AssertionError, match="max difference / rounding bound"):
        assert_same_gaussians({1: runs[1], 2: bad})


def test_mcmc_global_cap_holds_across_ranks(run_workers, tmp_path):
    cap = 500  # 400 initial Gaussians, +5% per refine: the cap is reached within 40 steps
    results = run_workers("trainer_workers:train", 3, mcmc_config(str(tmp_path / "m"), cap))
    counts = results[0]["counts"]
    assert sum(counts) == cap
    assert sorted(r["local_cap"] for r in results) == [166, 167, 167]  # the global cap, split
    assert all(np.isfinite(r["metrics"]["loss"]) for r in results)


def test_rebalancing_keeps_every_gaussian_once_and_the_render(run_workers, tmp_path):
    cfg = tiny_config(str(tmp_path / "rb"), max_steps=5)
    r0, r1 = run_workers("trainer_workers:rebalance", 2, cfg)
    assert r0["counts"][1] == 3 and r0["after_counts"] == [e - s for s, e in r0["bounds"]]
    for k in r0["before"]:
        before = torch.cat([r0["before"][k], r1["before"][k]])
        after = torch.cat([r0["after"][k], r1["after"][k]])
        torch.testing.assert_close(after, before, rtol=0, atol=0)  # exactly once, in order
        m_before = torch.cat([r0["moments"][k], r1["moments"][k]])
        m_after = torch.cat([r0["moments_after"][k], r1["moments_after"][k]])
        torch.testing.assert_close(m_after, m_before, rtol=0, atol=0)  # Adam moved with them
    torch.testing.assert_close(r0["render_after"], r0["render_before"])
    assert r0["finite_after_steps"] and r1["finite_after_steps"], "Adam on the moved rows: finite, v >= 0"


@pytest.fixture(scope="module")
def w2_checkpoint(tmp_path_factory, run_workers):
    out = tmp_path_factory.mktemp("ckpt")
    cfg = tiny_config(str(out), max_steps=15, save_steps=[15])
    results = run_workers("trainer_workers:train", 2, cfg)
    return out, results


@pytest.mark.parametrize("W", [1, 2, 3])
def test_w2_checkpoint_resumes_on_any_world_size(run_workers, w2_checkpoint, W):
    out, trained = w2_checkpoint
    cfg = tiny_config(str(out / f"resume{W}"), max_steps=15, ckpt=str(out / "ckpts"))
    resumed = run_workers("trainer_workers:resume", W, cfg)
    assert all(r["start_step"] == 15 for r in resumed)
    for k in trained[0]["params"]:
        saved = torch.cat([r["params"][k] for r in trained])
        torch.testing.assert_close(torch.cat([r["params"][k] for r in resumed]), saved, rtol=0, atol=0)
    torch.testing.assert_close(resumed[0]["render"], trained[0]["render"], rtol=0, atol=1e-6)
    assert torch.equal(torch.cat([r["uid"] for r in resumed]), torch.cat([r["uid"] for r in trained]))
    if W == 2:  # the same ranks continue their own random streams (densification draws)
        for r in range(2):
            assert torch.equal(resumed[r]["rng"], trained[r]["rng"])


def test_a_checkpoint_without_ids_resumes_with_ids_in_global_order(run_workers, w2_checkpoint, tmp_path):
    """Checkpoints written before Gaussians had ids: the ids are their global indices."""
    import shutil

    from distsplat.train.files import checkpoint as ck

    out, trained = w2_checkpoint
    meta = ck.read_meta(out / "ckpts")
    old = tmp_path / "ckpts" / Path(meta["dir"]).name
    shutil.copytree(meta["dir"], old)
    for shard in meta["shards"]:
        payload = torch.load(old / shard["file"], weights_only=True)
        assert payload["per_gaussian"].pop("uid") is not None  # as written before ids existed
        torch.save(payload, old / shard["file"])
        shard["sha256"] = ck._sha256(old / shard["file"])
    meta = {k: v for k, v in meta.items() if k not in ("dir", "meta_sha256")}
    meta["meta_sha256"] = ck._meta_digest(meta)
    (old / "meta.json").write_text(json.dumps(meta))
    cfg = tiny_config(str(tmp_path / "resume"), max_steps=15, ckpt=str(old))
    resumed = run_workers("trainer_workers:resume", 3, cfg)
    assert torch.equal(torch.cat([r["uid"] for r in resumed]), torch.arange(meta["num_gaussians"]))
    for k in trained[0]["params"]:
        assert torch.equal(torch.cat([r["params"][k] for r in resumed]), torch.cat([r["params"][k] for r in trained]))


# ------------------------------------------------------------------ the CLI under torchrun

@pytest.mark.slow
def test_cli_end_to_end_two_ranks(tmp_path):
    out = tmp_path / "run"
    p = torchrun(["default", "--max_steps", "120", "--eval_steps", "10", "120", "--save_steps", "60", "120",
                  "--log_every", "10", "--result_dir", str(out), *TINY_FLAGS,
                  "--strategy.refine_start_iter", "40", "--strategy.refine_every", "20"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "final: PSNR" in p.stdout
    early = json.loads((out / "stats" / "val_step0010.json").read_text())
    final = json.loads((out / "stats" / "val_step0120.json").read_text())
    # Initialized from the ground truth's centres, it starts near 21 dB; training must add.
    assert final["psnr"] > 22.0 and final["psnr"] > early["psnr"] + 1.0
    losses = [float(line.split("loss ")[1].split(",")[0]) for line in p.stderr.splitlines() if "/120: loss" in line]
    # one line at step 1 (the first comes early), then every --log_every 10
    assert len(losses) == 13 and losses[-1] < 0.7 * losses[0], losses  # the loss falls
    for r in (0, 1):
        train_stats = json.loads((out / "stats" / f"train_step0120_rank{r}.json").read_text())
        assert {"mem", "ellipse_time", "num_GS"} <= set(train_stats)
    assert (out / "cfg.yml").is_file() and list((out / "renders").glob("val_step0120_*.png"))
    ckpts = sorted(p.name for p in (out / "ckpts").iterdir())
    assert ckpts == ["step_000060", "step_000120"]
    # The merged PLY holds every Gaussian of the checkpoint, in rank order (plyfile reads it).
    plyfile = pytest.importorskip("plyfile")
    v = plyfile.PlyData.read(str(out / "ply" / "point_cloud_0120.ply"))["vertex"]
    meta = json.loads((out / "ckpts" / "step_000120" / "meta.json").read_text())
    assert len(v) == meta["num_gaussians"] == final["num_GS"]
    means = torch.cat([torch.load(out / "ckpts" / "step_000120" / s["file"])["params"]["means"]
                       for s in meta["shards"]])
    np.testing.assert_array_equal(np.stack([v["x"], v["y"], v["z"]], 1), means.numpy())


def test_work_imbalance_is_reported_from_the_ranks_pairs(run_workers, tmp_path):
    """balance.py: the log interval's median over steps of max/mean over ranks of the pairs
    each rank projected and rasterized, recomputed here from every rank's own renders."""
    from distsplat.train.config import SyntheticConfig

    # The tabletop scene at a small size: cameras see different parts of it, so the ranks' pairs differ
    cfg = tiny_config(str(tmp_path / "w2"), max_steps=20, log_every=10, eval_steps=[20],
                      synthetic=SyntheticConfig(kind="tabletop", num_cameras=12, width=48, height=36, seed=1))
    ranks = run_workers("trainer_workers:train_work_meter", 2, cfg)
    last = slice(10, 20)  # the last log interval
    for key, field in (("projected_max_over_mean", "pairs_projected"), ("rasterized_max_over_mean", "pairs_rendered")):
        per_rank = np.array([[c[field] for c in r["comms"][last]] for r in ranks], dtype=float)  # [W, K]
        assert per_rank.shape == (2, 10) and (per_rank > 0).all()
        want = float(np.median(per_rank.max(0) / per_rank.mean(0)))
        for r in ranks:
            assert r["metrics"][key] == pytest.approx(want, rel=1e-12), key
        assert 1.0 <= want <= 2.0
    assert ranks[0]["metrics"]["pairs_projected"] == pytest.approx(np.mean([c["pairs_projected"] for c in ranks[0]["comms"][last]]))
    assert ranks[0]["metrics"]["projected_max_over_mean"] > 1.0 and ranks[0]["metrics"]["rasterized_max_over_mean"] > 1.0
    stats = json.loads((tmp_path / "w2" / "stats" / "train_step0020_rank1.json").read_text())
    assert stats["rasterized_max_over_mean"] == ranks[1]["metrics"]["rasterized_max_over_mean"]
