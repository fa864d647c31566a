"""CameraBatcher without processes: W batchers built with the same arguments stand in
for W ranks (the batcher never reads the rank)."""

import numpy as np
import pytest
import torch

from distsplat.distributed import CameraBatcher


def take(batcher, n):
    return [next(batcher) for _ in range(n)]


@pytest.mark.parametrize("num_cameras,W,k", [(10, 3, 1), (11, 4, 2), (8, 2, 4), (5, 1, 2)])
def test_ownership_is_a_disjoint_cover_of_near_equal_shards(num_cameras, W, k):
    b = CameraBatcher(num_cameras, W, k, seed=3)
    shards = [b.own_cameras(r) for r in range(W)]
    assert torch.equal(torch.cat(shards).sort().values, torch.arange(num_cameras))
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == num_cameras
    for r, s in enumerate(shards):
        assert (b.owner[s] == r).all()


def test_ownership_is_a_seeded_shuffle_not_the_identity():
    a, b = CameraBatcher(40, 4, 1, seed=0), CameraBatcher(40, 4, 1, seed=1)
    assert not torch.equal(a.owner, b.owner)
    assert not torch.equal(a.own_cameras(0), torch.arange(10)), "a contiguous split of ids"


def test_identical_on_every_rank_and_deterministic():
    ranks = [CameraBatcher(23, 3, 2, seed=7) for _ in range(3)]
    runs = [take(b, 20) for b in ranks]
    for step in range(20):
        for other in runs[1:]:
            assert torch.equal(runs[0][step].cameras, other[step].cameras)
            assert torch.equal(runs[0][step].camera_owner, other[step].camera_owner)
    again = take(CameraBatcher(23, 3, 2, seed=7), 20)
    assert all(torch.equal(x.cameras, y.cameras) for x, y in zip(runs[0], again))
    different = take(CameraBatcher(23, 3, 2, seed=8), 20)
    assert any(not torch.equal(x.cameras, y.cameras) for x, y in zip(runs[0], different))


def test_each_batch_takes_k_own_cameras_per_rank_rank_major():
    b = CameraBatcher(17, 4, 2, seed=1)
    for batch in take(b, 12):
        assert torch.equal(batch.camera_owner, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
        assert torch.equal(b.owner[batch.cameras], batch.camera_owner), "owner is the fixed one"
        for r in range(4):
            cams = batch.cameras[batch.own(r)]
            assert len(set(cams.tolist())) == 2, "no repeat within a step"


def test_epoch_covers_every_camera_and_reshuffles():
    # shards of 5, 4, 4 with k = 2: an epoch is ceil(5 / 2) = 3 steps
    b = CameraBatcher(13, 3, 2, seed=5)
    assert b.steps_per_epoch == 3
    epochs = []
    for _ in range(4):
        batches = take(b, b.steps_per_epoch)
        assert {x.epoch for x in batches} == {len(epochs)}
        assert [x.step for x in batches] == [0, 1, 2]
        seen = torch.cat([x.cameras for x in batches])
        assert set(seen.tolist()) == set(range(13)), "every camera at least once per epoch"
        assert len(seen) == 18 and len(seen) - 13 <= 3 * 2, "repeats only to fill the steps"
        epochs.append(seen)
    assert len({tuple(e.tolist()) for e in epochs}) == 4, "a new order every epoch"
    # per-shard order changes, ownership does not
    assert all(torch.equal(b.owner[e], epochs[0].new_tensor([0] * 2 + [1] * 2 + [2] * 2).repeat(3))
               for e in epochs)


def test_mid_epoch_resume_continues_the_same_sequence():
    ref = CameraBatcher(31, 3, 2, seed=11)
    expected = take(ref, 25)
    b = CameraBatcher(31, 3, 2, seed=11)
    take(b, 7)  # mid-epoch: 6 steps per epoch
    state = b.state_dict()
    assert (state["epoch"], state["step"]) == (1, 1)
    fresh = CameraBatcher(31, 3, 2, seed=11)
    fresh.load_state_dict(state)
    rest = take(fresh, 18)
    for got, want in zip(rest, expected[7:]):
        assert torch.equal(got.cameras, want.cameras) and (got.epoch, got.step) == (want.epoch, want.step)


def test_resume_rejects_another_seed_and_restarts_epoch_on_another_layout():
    b = CameraBatcher(20, 2, 1, seed=0)
    take(b, 13)  # epoch 1, step 3
    with pytest.raises(ValueError, match="seed"):
        CameraBatcher(20, 2, 1, seed=1).load_state_dict(b.state_dict())
    other = CameraBatcher(20, 4, 1, seed=0)
    other.load_state_dict(b.state_dict())
    assert (other.epoch, other.step) == (2, 0)


def test_batch_is_a_pure_function_of_epoch_and_step():
    b = CameraBatcher(12, 2, 3, seed=4)
    seq = take(b, 6)
    for x in seq:
        assert torch.equal(CameraBatcher(12, 2, 3, seed=4).batch(x.epoch, x.step).cameras, x.cameras)


@pytest.mark.parametrize("args,match", [
    ((5, 3, 2, 0), "distinct cameras"), ((0, 1, 1, 0), "num_cameras"),
    ((4, 0, 1, 0), "world_size"), ((4, 2, 1, -1), "seed"), ((4, 2, 1.0, 0), "cameras_per_rank"),
])
def test_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        CameraBatcher(*args)


def test_uses_no_global_random_state():
    torch.manual_seed(0)
    np.random.seed(0)
    a = take(CameraBatcher(9, 3, 1, seed=2), 5)
    torch.manual_seed(123)
    np.random.seed(123)
    b = take(CameraBatcher(9, 3, 1, seed=2), 5)
    assert all(torch.equal(x.cameras, y.cameras) for x, y in zip(a, b))


@pytest.mark.parametrize("n,W,k", [(7, 1, 1), (10, 3, 2), (23, 4, 3), (9, 2, 4)])
def test_own_batch_is_the_batch_cameras_of_the_rank(n, W, k):
    """own_batch (the loader's per-step schedule) without building the batch: the same
    cameras in the same order as batch(...).cameras[own(rank)], every rank, epoch, step."""
    b = CameraBatcher(n, W, k, seed=5)
    for epoch in range(3):
        for step in range(b.steps_per_epoch):
            batch = b.batch(epoch, step)
            for r in range(W):
                assert b.own_batch(epoch, step, r) == batch.cameras[batch.own(r)].tolist()
    with pytest.raises(ValueError, match="rank"):
        b.own_batch(0, 0, W)


# --------------------------------------------------------------- cost-balanced epochs (issue 33)


def camera_costs(n, seed=0):
    """Per-camera costs as uneven as a real capture's pair counts (a factor ~3 apart)."""
    return np.random.default_rng(seed).uniform(1000, 3000, n).round()


def floor_ratio(b, costs):
    """max/mean of the shards' total costs: what no order within fixed shards can beat on
    average (each rank renders its whole shard every epoch)."""
    totals = np.array([costs[b.own_cameras(r).numpy()].sum() for r in range(b.world_size)])
    return totals.max() / totals.mean()


def epoch_batches(b, epoch):
    return [b.batch(epoch, s) for s in range(b.steps_per_epoch)]


def step_sums(batch, costs, W):
    """[W] each rank's summed camera cost in one batch."""
    return np.array([costs[batch.cameras[batch.own(r)].numpy()].sum() for r in range(W)])


@pytest.mark.parametrize("n,W,k", [(88, 4, 1), (88, 4, 4), (57, 4, 2), (13, 3, 2), (23, 4, 3), (9, 2, 4)])
def test_balanced_epoch_sees_every_camera_once_and_keeps_the_layout(n, W, k):
    b = CameraBatcher(n, W, k, seed=5)
    b.set_costs(1, camera_costs(n))
    for epoch in (1, 2):
        batches = epoch_batches(b, epoch)
        seen = torch.cat([x.cameras for x in batches])
        assert set(seen.tolist()) == set(range(n)), "every camera at least once per epoch"
        assert len(seen) == W * k * b.steps_per_epoch
        extra = len(seen) - n
        assert extra == sum(k * b.steps_per_epoch - len(b.own_cameras(r)) for r in range(W)), "repeats only to fill"
        for x in batches:
            assert torch.equal(b.owner[x.cameras], x.camera_owner), "ownership is the fixed one"
            for r in range(W):
                assert len(set(x.cameras[x.own(r)].tolist())) == k, "no camera twice in a step"
            for r in range(W):
                assert b.own_batch(epoch, x.step, r) == x.cameras[x.own(r)].tolist()


def test_balanced_steps_take_the_same_cost_stratum_on_every_rank():
    """k = 1: step by step the ranks render cameras of the same cost rank within their shards;
    the median step's max/mean falls from the seeded order's to near what the fixed shards
    allow (their totals' max/mean)."""
    n, W = 88, 4
    costs = camera_costs(n, seed=1)
    b = CameraBatcher(n, W, 1, seed=3)
    seeded = [step_sums(x, costs, W) for x in epoch_batches(b, 0)]
    b.set_costs(1, costs)
    balanced = epoch_batches(b, 1)
    ranks = {r: np.argsort(np.argsort(-costs[b.own_cameras(r).numpy()])) for r in range(W)}  # cost rank in shard
    for x in balanced:
        strata = {int(ranks[r][list(b.own_cameras(r).numpy()).index(int(x.cameras[r]))]) for r in range(W)}
        assert len(strata) == 1, f"step {x.step}: ranks render cost ranks {strata}"
    ratio = lambda sums: float(np.median([s.max() / s.mean() for s in sums]))  # noqa: E731
    got = ratio([step_sums(x, costs, W) for x in balanced])
    assert got < floor_ratio(b, costs) + 0.03 and got < ratio(seeded) - 0.1, (got, floor_ratio(b, costs), ratio(seeded))


def test_balanced_groups_have_near_equal_sums_with_several_cameras_per_rank():
    n, W, k = 88, 4, 4
    costs = camera_costs(n, seed=2)
    b = CameraBatcher(n, W, k, seed=3)
    b.set_costs(1, costs)
    for x in epoch_batches(b, 1):
        sums = step_sums(x, costs, W)
        assert sums.max() / sums.mean() < floor_ratio(b, costs) + 0.03, sums
    # per rank, the epoch's steps cost nearly the same (groups dealt lightest-first), not a sorted ramp
    per_rank = np.array([step_sums(x, costs, W) for x in epoch_batches(b, 1)])  # [S, W]
    assert (per_rank.max(0) / per_rank.min(0)).max() < 1.25


def test_balanced_sequence_is_identical_on_every_rank_and_a_function_of_seed_and_costs():
    n, W, k = 40, 4, 2
    costs = camera_costs(n, seed=4)
    ranks = [CameraBatcher(n, W, k, seed=7) for _ in range(W)]
    for b in ranks:
        b.set_costs(1, costs)
    runs = [[x.cameras for e in (1, 2) for x in epoch_batches(b, e)] for b in ranks]
    assert all(torch.equal(a, c) for other in runs[1:] for a, c in zip(runs[0], other))
    other_seed = CameraBatcher(n, W, k, seed=8)
    other_seed.set_costs(1, costs)
    assert any(not torch.equal(a, x.cameras) for a, x in zip(runs[0], epoch_batches(other_seed, 1)))
    other_costs = CameraBatcher(n, W, k, seed=7)
    other_costs.set_costs(1, costs[::-1].copy())
    assert any(not torch.equal(a, x.cameras) for a, x in zip(runs[0], epoch_batches(other_costs, 1)))
    # epochs before the first agreed costs keep the seeded order; each later one reshuffles its steps
    plain = CameraBatcher(n, W, k, seed=7)
    assert all(torch.equal(x.cameras, y.cameras) for x, y in zip(epoch_batches(plain, 0), epoch_batches(ranks[0], 0)))
    assert [x.cameras.tolist() for x in epoch_batches(ranks[0], 1)] != [x.cameras.tolist() for x in epoch_batches(ranks[0], 2)]


def test_unknown_costs_are_the_mean_of_the_known_and_none_known_keeps_the_seeded_order():
    n, W = 20, 2
    costs = camera_costs(n, seed=5)
    part = costs.copy()
    part[[3, 7]] = np.nan
    filled = costs.copy()
    filled[[3, 7]] = np.nanmean(part)
    a, b = CameraBatcher(n, W, 1, seed=1), CameraBatcher(n, W, 1, seed=1)
    a.set_costs(1, part)
    b.set_costs(1, filled)
    assert all(torch.equal(x.cameras, y.cameras) for x, y in zip(epoch_batches(a, 1), epoch_batches(b, 1)))
    c = CameraBatcher(n, W, 1, seed=1)
    c.set_costs(1, np.full(n, np.nan))
    assert c.costs == {} and torch.equal(c.batch(1, 0).cameras, CameraBatcher(n, W, 1, seed=1).batch(1, 0).cameras)


def test_costs_cannot_change_an_epoch_already_drawn_and_old_entries_are_dropped():
    b = CameraBatcher(30, 3, 1, seed=2)
    b.batch(1, 0)  # the image loader drew ahead into epoch 1
    with pytest.raises(ValueError, match="already drawn"):
        b.set_costs(1, camera_costs(30))
    b.set_costs(2, camera_costs(30, 1))
    b.set_costs(3, camera_costs(30, 2))
    b.set_costs(4, camera_costs(30, 3), keep_from=3)
    assert sorted(b.costs) == [3, 4], "epoch 2's costs order no epoch from 3 on"
    assert b.costs_for(5) is b.costs[4] and b.costs_for(3) is b.costs[3] and b.costs_for(1) is None
    with pytest.raises(ValueError, match="30 costs"):
        b.set_costs(5, camera_costs(29))
    with pytest.raises(ValueError, match=">= 0"):
        b.set_costs(5, -camera_costs(30))


def test_balanced_mid_epoch_resume_replays_the_sequence_on_the_same_layout():
    n, W, k = 31, 3, 2
    ref = CameraBatcher(n, W, k, seed=11)
    ref.set_costs(1, camera_costs(n, 6))
    expected = take(ref, 25)
    b = CameraBatcher(n, W, k, seed=11)
    b.set_costs(1, camera_costs(n, 6))
    take(b, 9)  # mid-epoch 1 (6 steps per epoch)
    state = b.state_dict()
    assert isinstance(state["costs"]["1"], str), "compact in the checkpoint's JSON"
    fresh = CameraBatcher(n, W, k, seed=11)
    fresh.load_state_dict(state)
    rest = take(fresh, 16)
    for got, want in zip(rest, expected[9:]):
        assert torch.equal(got.cameras, want.cameras) and (got.epoch, got.step) == (want.epoch, want.step)
    # another layout: the per-camera costs order its epochs too (from the next epoch on)
    other = CameraBatcher(n, 2, 1, seed=11)
    other.load_state_dict(state)
    assert np.array_equal(other.costs_for(other.epoch), camera_costs(n, 6))
    assert set(other.own_batch(other.epoch, 0, 0)) <= set(other.own_cameras(0).tolist())
