"""Communication budget (docs/design.md invariant 2), counted from REAL calls: every
torch.distributed function and every explicit device->host read (Tensor.tolist, .item,
.cpu, .numpy, int(), float(), bool(), index) is wrapped inside the workers while the
distributed layer runs (the one-process render stages, which sync on their own when
rasterizing on CPU, are excluded). Bytes are checked against pair counts taken from the
one-process reference, not from meta. Two calls per rank: a user's (every check on,
owners not rank-major) and the trainer's (device checks off, rank-major owners)."""

import pytest

from distsplat.render import rasterize
from scenes import PARAM_NAMES, case_layout

SEED = 5
MODES = ("user", "trainer")


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda w: f"W{w}")
def world(request, run_workers):
    W = request.param
    return W, run_workers("workers:budget", W, "base", SEED)


def reference_pairs(W):
    """(camera_ids, gaussian_ids) of every visible pair, from the one-process render."""
    layout = case_layout("base", W)
    _, _, meta = rasterize(*[layout["gaussians"][k] for k in PARAM_NAMES], layout["viewmats"],
                           layout["Ks"], 32, 24, backend="torch")
    return layout, meta["camera_ids"], meta["gaussian_ids"]


@pytest.mark.parametrize("mode", MODES)
def test_forward_one_count_exchange_one_payload_one_host_read(world, mode):
    """W > 1: two all-to-alls (counts, payload) and one read (the counts). W = 1: no
    collective; a read only when a check on device values runs (the user's check_finite),
    none for the trainer."""
    W, results = world
    for rank, res in enumerate(results):
        calls, _ = res[mode]["forward"]
        if W == 1:
            expected = {"item": 1} if mode == "user" else {}
        else:
            expected = {"all_to_all_single": 2, "tolist": 1}
        assert calls == expected, f"rank {rank} ({mode}): {calls}"
        assert res[mode]["comm"]["host_syncs"] == sum(expected.values()) - expected.get("all_to_all_single", 0)


@pytest.mark.parametrize("mode", MODES)
def test_backward_one_reverse_all_to_all(world, mode):
    W, results = world
    for rank, res in enumerate(results):
        calls, a2a = res[mode]["backward"]
        assert calls == ({} if W == 1 else {"all_to_all_single": 1}), f"rank {rank}: {calls}"
        if W > 1:
            fwd_payload = res[mode]["forward"][1][1]
            assert a2a[0]["in_splits"] == fwd_payload["out_splits"]
            assert a2a[0]["out_splits"] == fwd_payload["in_splits"]
            # only the columns with gradients travel back: 2 + 3 + 1 + 3 of the 12 (no depth, no integers)
            assert a2a[0]["in_bytes"] == sum(fwd_payload["out_splits"]) * 9 * 8


@pytest.mark.parametrize("mode", MODES)
def test_payload_bytes_match_visible_pairs(world, mode):
    W, results = world
    if W == 1:
        return
    _, cam, gid = reference_pairs(W)
    # float64: means2d 2, conics 3, opacity 1, RGB 3, depth 1, camera id 1 and radii 1 (raw bits)
    F = 12
    for rank, res in enumerate(results):
        owner = res[mode]["owner"]
        bounds = [r[mode]["bounds"] for r in results]
        counts, payload = res[mode]["forward"][1]
        assert counts["in_bytes"] == W * 5 * 8, "the count exchange is W rows of 5 int64"
        start, end = res[mode]["bounds"]
        mine = (gid >= start) & (gid < end)
        to = [int((mine & (owner[cam] == r)).sum()) for r in range(W)]
        frm = [int(((gid >= b[0]) & (gid < b[1]) & (owner[cam] == rank)).sum()) for b in bounds]
        assert payload["in_splits"] == to and payload["out_splits"] == frm, f"rank {rank}"
        assert payload["in_bytes"] == sum(to) * F * 8  # float64 scene
        comm = res[mode]["comm"]
        assert comm["bytes_per_pair"] == F * 8
        assert comm["pairs_sent"] == sum(to) - to[rank]
        assert comm["bytes_sent"] == (sum(to) - to[rank]) * F * 8 + (W - 1) * 40
        assert comm["bytes_received"] == (sum(frm) - frm[rank]) * F * 8 + (W - 1) * 40
        assert comm["backward_bytes_sent"] == (sum(frm) - frm[rank]) * 9 * 8
        assert (comm["collectives"], comm["host_syncs"], comm["backward_collectives"]) == (2, 1, 1)
    assert sum(len(r[mode]["own"]) for r in results) == len(results[0][mode]["owner"])
