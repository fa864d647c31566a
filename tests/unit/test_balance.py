"""Issue 33's balancing without processes: the chunk boundaries by projected pairs, the
initial points' interleaving and the Balancer's bookkeeping on one rank (its collectives
are then the identity; tests/distributed/test_balanced_ranks.py runs it on 2-4 ranks)."""

import numpy as np
import pytest
import torch

from distsplat.distributed import DistContext
from distsplat.train.model.balance import Agreement, Balancer, interleave, pair_bounds
from distsplat.train.model.size_groups import size_groups

CTX = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


def pairs_of(bounds, density):
    """[W] expected pairs of each chunk when Gaussian i projects density[i] pairs."""
    return np.array([density[a:b].sum() for a, b in bounds])


@pytest.mark.parametrize("counts,rho", [([100, 100, 100, 100], [1, 1, 2, 1]), ([300, 250, 400], [1.0, 1.3, 0.8]),
                                        ([50, 0, 70], [2.0, 0.0, 1.0])])
def test_pair_bounds_equalize_the_pairs_of_piecewise_constant_density(counts, rho):
    n = sum(counts)
    density = np.repeat(rho, counts).astype(float)
    bounds = pair_bounds(counts, rho, max_count_ratio=10.0)
    assert bounds[0][0] == 0 and bounds[-1][1] == n and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    before = pairs_of([(sum(counts[:r]), sum(counts[:r + 1])) for r in range(len(counts))], density)
    after = pairs_of(bounds, density)
    assert after.max() / after.mean() < 1.01 < before.max() / before.mean()


def test_pair_bounds_keep_gaussian_counts_within_the_ratio():
    counts, rho = [100, 100, 100, 100], [1, 1, 3, 1]
    free = pair_bounds(counts, rho, max_count_ratio=10.0)
    capped = pair_bounds(counts, rho, max_count_ratio=1.25)
    sizes = lambda b: np.diff([0] + [e for _, e in b])  # noqa: E731
    assert sizes(free).max() / sizes(free).min() > 1.25, "the test needs a cap that binds"
    assert sizes(capped).max() / sizes(capped).min() <= 1.25
    density = np.repeat(rho, counts).astype(float)
    equal = [(0, 100), (100, 200), (200, 300), (300, 400)]
    ratio = lambda b: pairs_of(b, density).max() / pairs_of(b, density).mean()  # noqa: E731
    assert ratio(free) < ratio(capped) < ratio(equal), "capped: part of the way, not none of it"
    assert pair_bounds([100, 100], [1.0, 1.0], 1.25) == [(0, 100), (100, 200)], "balanced: no move"


def test_interleave_is_a_seeded_permutation_independent_of_the_world_size():
    a = interleave(1000, seed=3)
    assert sorted(a.tolist()) == list(range(1000))
    assert np.array_equal(a, interleave(1000, seed=3)) and not np.array_equal(a, interleave(1000, seed=4))
    # contiguous chunks of the dealt order sample the whole range (a capture's point list is
    # ordered by region): every quarter of the chunk holds ~1/4 of each region
    chunk = a[:250]
    assert all(40 < ((chunk >= lo) & (chunk < lo + 250)).sum() < 85 for lo in range(0, 1000, 250))


def test_agreement_pair_imbalance():
    assert Agreement(None, [1.0, 1.0], [100, 120]).pair_imbalance() == pytest.approx(120 / 110)
    assert Agreement(None, [2.0, 1.0], [50, 100]).pair_imbalance() == pytest.approx(1.0)
    assert Agreement(None, [0.0, 0.0], [0, 0]).pair_imbalance() == 1.0


def fake_step(cams, pairs_per_camera, width=8, height=6):
    """One render's meta as distributed_rasterize gives it: the projection's pairs sorted by
    camera, and the count exchange's pairs_projected."""
    ids = torch.repeat_interleave(torch.arange(len(cams)), torch.tensor(pairs_per_camera))
    meta = {"camera_ids": ids, "comm": {"pairs_projected": int(sum(pairs_per_camera))}}
    groups = size_groups([width] * len(cams), [height] * len(cams), [0] * len(cams), 0)
    return [meta], groups, torch.tensor(cams)


def test_balancer_keeps_each_cameras_last_pairs_and_agrees_them():
    b = Balancer(CTX, torch.device("cpu"), num_cameras=6, cameras=True, pairs=True, lead=2)
    b.record(*fake_step([4, 1], [30, 10]), n_local=100)
    b.record(*fake_step([1, 2], [12, 0]), n_local=100)  # camera 1 again: its last count wins
    agreed = b.agree(n_local=100)
    assert agreed.costs[[1, 2, 4]].tolist() == [12, 0, 30]
    assert np.isnan(agreed.costs[[0, 3, 5]]).all(), "never rendered: unknown"
    assert agreed.counts == [100] and agreed.pairs_per_gaussian == [pytest.approx((40 + 12) / 100 / 2)]
    b.rows_moved()
    assert b.agree(n_local=100).pairs_per_gaussian == [0.0], "moved rows: measured afresh"


def test_balancer_agrees_lead_steps_before_each_epoch():
    b = Balancer(CTX, torch.device("cpu"), num_cameras=6, cameras=True, pairs=False, lead=2)
    due = {p: b.due(p, steps_per_epoch=5) for p in range(16)}
    assert {p: e for p, e in due.items() if e is not None} == {3: 1, 8: 2, 13: 3}
    assert Balancer(CTX, torch.device("cpu"), 6, cameras=False, pairs=False, lead=2).due(3, 5) is None
    # a lead longer than an epoch: agreed that many steps ahead, still one epoch at a time
    far = Balancer(CTX, torch.device("cpu"), 6, cameras=True, pairs=False, lead=7)
    assert {p: e for p in range(12) if (e := far.due(p, 5)) is not None} == {3: 2, 8: 3}


def test_balancer_state_round_trip_gives_the_next_agreement_the_same_costs():
    b = Balancer(CTX, torch.device("cpu"), num_cameras=5, cameras=True, pairs=True, lead=1)
    b.record(*fake_step([0, 3], [7, 9]), n_local=10)
    state = b.state_dict()
    fresh = Balancer(CTX, torch.device("cpu"), num_cameras=5, cameras=True, pairs=True, lead=1)
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.agree(10).costs, b.agree(10).costs)
    with pytest.raises(ValueError, match="5"):
        Balancer(CTX, torch.device("cpu"), num_cameras=4, cameras=True, pairs=True, lead=1).load_state_dict(state)
    assert Balancer(CTX, torch.device("cpu"), 5, cameras=False, pairs=True, lead=1).state_dict() == {}
