"""Communication budget (DESIGN.md invariant 2), counted from REAL calls: every
torch.distributed function and every explicit device->host read (Tensor.tolist, .item,
.cpu, .numpy, int(), float(), bool(), index) is wrapped inside the workers while the
distributed layer runs (the one-process render stages, which sync on their own when
rasterizing on CPU, are excluded). Bytes are checked against pair counts taken from the
one-process reference, not from meta."""

import pytest

from distsplat.render import rasterize
from scenes import PARAM_NAMES, case_layout

SEED = 5


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


def test_forward_one_count_exchange_one_payload_one_host_read(world):
    W, results = world
    for rank, res in enumerate(results):
        calls, _ = res["forward"]
        expected = {"tolist": 1} if W == 1 else {"all_to_all_single": 2, "tolist": 1}
        assert calls == expected, f"rank {rank}: {calls}"


def test_backward_one_reverse_all_to_all(world):
    W, results = world
    for rank, res in enumerate(results):
        calls, a2a = res["backward"]
        assert calls == ({} if W == 1 else {"all_to_all_single": 1}), f"rank {rank}: {calls}"
        if W > 1:
            fwd_payload = res["forward"][1][1]
            assert a2a[0]["in_splits"] == fwd_payload["out_splits"]
            assert a2a[0]["out_splits"] == fwd_payload["in_splits"]


def test_payload_bytes_match_visible_pairs(world):
    W, results = world
    if W == 1:
        return
    layout, cam, gid = reference_pairs(W)
    owner = layout["owner"]
    F = 10 + 3  # means2d, depth, conic, opacity, camera, radii + RGB
    for rank, res in enumerate(results):
        counts, payload = res["forward"][1]
        assert counts["in_bytes"] == W * 4 * 8, "the count exchange is W rows of 4 int64"
        start, end = res["bounds"]
        mine = (gid >= start) & (gid < end)
        to = [int((mine & (owner[cam] == r)).sum()) for r in range(W)]
        frm = [int(((gid >= b[0]) & (gid < b[1]) & (owner[cam] == rank)).sum())
               for b in layout["bounds"]]
        assert payload["in_splits"] == to and payload["out_splits"] == frm, f"rank {rank}"
        assert payload["in_bytes"] == sum(to) * F * 8  # float64 scene
        comm = res["comm"]
        assert comm["bytes_per_pair"] == F * 8
        assert comm["pairs_sent"] == sum(to) - to[rank]
        assert comm["bytes_sent"] == (sum(to) - to[rank]) * F * 8 + (W - 1) * 32
        assert comm["bytes_received"] == (sum(frm) - frm[rank]) * F * 8 + (W - 1) * 32
        assert (comm["collectives"], comm["host_syncs"], comm["backward_collectives"]) == (2, 1, 1)
    assert sum(len(r["own"]) for r in results) == len(owner)
