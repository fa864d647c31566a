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
