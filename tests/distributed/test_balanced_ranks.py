"""Issue 33 on gloo CPU ranks: the Trainer's camera balancing draws the same sequence on every
rank, every camera once per epoch, a function of the seed and the costs every rank agreed (each
camera's pairs at its last render, as the count exchange saw them), and a resume replays it;
the projection balancing moves chunk boundaries by pairs and keeps every Gaussian once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer_workers import tiny_config

from distsplat.distributed import CameraBatcher


def balanced_config(result_dir: str, **overrides):
    """tiny_config (12 cameras, 10 of them training views) with the balancing on and a log
    interval that is no epoch boundary."""
    return tiny_config(result_dir, **{"balance_cameras": True, "balance_pairs": True, "log_every": 7, **overrides})


def test_balanced_sequence_is_identical_on_every_rank_and_follows_the_agreed_costs(run_workers, tmp_path):
    W = 3
    cfg = balanced_config(str(tmp_path / "w3"), max_steps=20)
    ranks = run_workers("balance_workers:train", W, cfg)
    first = ranks[0]
    for r in ranks[1:]:  # the same batches and the same agreed costs everywhere
        assert [s[:2] for s in r["steps"]] == [s[:2] for s in first["steps"]]
        assert [(a, e) for a, e, _ in r["agreed"]] == [(a, e) for a, e, _ in first["agreed"]]
        assert all(np.array_equal(x, y, equal_nan=True) for (_, _, x), (_, _, y) in zip(r["agreed"], first["agreed"]))
    spe = first["steps_per_epoch"]
    assert [(a, e) for a, e, _ in first["agreed"]] == [(e * spe - cfg.prefetch, e) for e in range(1, 20 // spe + 1)]
    costs = [c for _, _, c in first["agreed"]]
    assert np.isfinite(costs[1]).all() and len(set(costs[1].tolist())) > 3, "uneven, all known after an epoch"

    # Each agreed cost is the camera's pairs at its last render before the agreement: what its
    # owner rasterized then (one own camera per rank and step), from the count exchange.
    last: dict = {}
    agreements = iter(first["agreed"])
    nxt = next(agreements)
    for i, (step, cams, _) in enumerate(first["steps"]):
        while nxt is not None and nxt[0] == step:
            _, _, c = nxt
            for cam, pairs in last.items():
                assert c[cam] == pairs, (step, cam, c[cam], pairs)
            assert all(np.isnan(c[cam]) for cam in range(len(c)) if cam not in last)
            nxt = next(agreements, None)
        for r, cam in enumerate(cams):
            last[cam] = ranks[r]["steps"][i][2]

    # A pure function of the seed and the agreed costs, every camera once per epoch.
    n = len(costs[0])
    ref = CameraBatcher(n, W, 1, seed=cfg.seed)
    for _, epoch, c in first["agreed"]:
        ref.set_costs(epoch, c)
    for step, cams, _ in first["steps"]:
        assert ref.batch(step // spe, step % spe).cameras.tolist() == cams, step
    for epoch in range(20 // spe):
        seen = {c for step, cams, _ in first["steps"] if step // spe == epoch for c in cams}
        assert seen == set(range(n)), epoch
    plain = CameraBatcher(n, W, 1, seed=cfg.seed)
    assert any(plain.batch(s // spe, s % spe).cameras.tolist() != cams for s, cams, _ in first["steps"][spe:]), \
        "the balancing changed the order"


def test_a_resume_replays_the_balanced_sequence(run_workers, tmp_path):
    """Saved mid-epoch after an agreement: the resumed run draws the uninterrupted run's batches
    (the agreed costs and each camera's last pairs are in the checkpoint) and ends with the same
    parameters, bit for bit."""
    cfg = balanced_config(str(tmp_path / "full"), max_steps=16, batch_size=2, save_steps=[10])
    full = run_workers("balance_workers:train", 2, cfg)
    resumed = run_workers("balance_workers:train", 2, balanced_config(
        str(tmp_path / "resumed"), max_steps=16, batch_size=2, ckpt=str(tmp_path / "full" / "ckpts" / "step_000010")))
    assert resumed[0]["start_step"] == 10 and resumed[0]["batch_start"] == 10
    tail = [s[:2] for s in full[0]["steps"] if s[0] >= 10]
    assert [s[:2] for s in resumed[0]["steps"]] == tail
    assert resumed[0]["agreed"], "an agreement after the resume"
    for (a, e, c), (a2, e2, c2) in zip(resumed[0]["agreed"], [x for x in full[0]["agreed"] if x[0] >= 10]):
        assert (a, e) == (a2, e2) and np.array_equal(c, c2, equal_nan=True)
    for r in range(2):
        for k, v in full[r]["params"].items():
            assert torch.equal(resumed[r]["params"][k], v), k


def test_projection_balancing_moves_chunks_by_pairs(run_workers, tmp_path):
    cfg = balanced_config(str(tmp_path / "p"), max_steps=10, balance_cameras=False)
    r0, r1 = run_workers("balance_workers:pair_move", 2, cfg)
    assert r0["moves"] and "projected pairs" in r0["moves"][0]["why"], r0["moves"]
    move = r0["moves"][0]
    sizes = [e - s for s, e in move["target"]]
    assert max(sizes) <= (1 + (cfg.rebalance_ratio - 1) / 2) * min(sizes), "Gaussian counts (memory) kept close"
    before = torch.cat([r0["moves"][0]["uid_before"], r1["moves"][0]["uid_before"]])
    after = torch.cat([r0["moves"][0]["uid_after"], r1["moves"][0]["uid_after"]])
    assert torch.equal(before, after), "every Gaussian once, in its global order"
    assert [r0["n_local"], r1["n_local"]] == sizes
    ratio = lambda i: max(r0["pairs"][i][0], r1["pairs"][i][0]) / np.mean([r0["pairs"][i][0], r1["pairs"][i][0]])  # noqa: E731
    assert ratio(-1) < ratio(0) - 0.2, (ratio(0), ratio(-1))
    assert r0["finite"] and r1["finite"]


def test_a_move_by_pairs_keeps_each_ranks_headroom_under_the_mcmc_cap(run_workers, tmp_path):
    """MCMC splits its global cap across the ranks; chunks of unequal counts must move the
    caps with them, or ranks that gave rows could grow past the global cap."""
    from trainer_workers import mcmc_config

    cfg = mcmc_config(str(tmp_path / "m"), cap=500)
    cfg.max_steps, cfg.balance_cameras, cfg.log_every = 10, False, 7
    r0, r1 = run_workers("balance_workers:pair_move", 2, cfg)
    assert r0["moves"], "a move by pairs happened"
    for move_0, move_1 in zip(r0["moves"], r1["moves"]):
        assert move_0["cap_after"] + move_1["cap_after"] == 500
        for r, m in enumerate((move_0, move_1)):
            n_after = m["target"][r][1] - m["target"][r][0]
            assert m["cap_after"] - n_after == m["cap_before"] - m["counts"][r], "the rank's headroom"


@pytest.mark.parametrize("flag", ["balance_cameras", "balance_pairs"])
def test_the_flags_turn_the_balancing_off(run_workers, tmp_path, flag):
    cfg = balanced_config(str(tmp_path / flag), max_steps=9, **{flag: False})
    ranks = run_workers("balance_workers:train", 2, cfg)
    if flag == "balance_cameras":
        assert ranks[0]["agreed"] == []
        n = 10
        plain = CameraBatcher(n, 2, 1, seed=cfg.seed)
        spe = plain.steps_per_epoch
        assert all(plain.batch(s // spe, s % spe).cameras.tolist() == cams for s, cams, _ in ranks[0]["steps"])
    else:
        assert ranks[0]["agreed"], "the cameras still balanced"
        r0, _ = run_workers("balance_workers:pair_move", 2, balanced_config(str(tmp_path / "p"), max_steps=10,
                                                                            balance_pairs=False))
        assert r0["moves"] == [], "no move by pairs"
