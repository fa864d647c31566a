"""scaling_gpu.py's model arithmetic and camera construction (CPU only, no timing): the
GPU-timed prediction is only as good as these few formulas. Its runs of the trainer's step
are checked in test_bench_trainer_step.py."""

import math

import numpy as np
import pytest

from benchmarks import scaling_gpu as sg

LINK = {"bandwidth_Bps": 1e9, "latency_s": 1e-5, "host_sync_s": 2e-5}


def _rec(stages, sent, received, bpp=52, b=1, collectives=None):
    return {"stages_ms": stages, "pairs_sent": sent, "pairs_received": received, "bytes_per_pair": bpp,
            "cameras_per_rank": b, **({"collectives": collectives} if collectives is not None else {})}


def test_exchange_is_zero_on_one_rank_and_adds_latency_syncs_and_the_busiest_ranks_bytes():
    assert sg.exchange_ms([0], [0], 1, 52, 52, LINK, 3, 1) == 0.0
    # busiest rank: max(max(100, 40), max(60, 250)) = 250 pairs
    got = sg.exchange_ms([100, 60], [40, 250], 2, 52, 40, LINK, 3, 1)
    want = 1e3 * (3 * 1e-5 + 2e-5) + 1e3 * 250 * 52 / 1e9 + 1e3 * 250 * 40 / 1e9
    assert got == pytest.approx(want, rel=1e-12)
    # a measured device copy slower than the link is the floor of that direction
    slow = sg.exchange_ms([100, 60], [40, 250], 2, 52, 40, LINK, 3, 1, copy_fwd_ms=5.0)
    assert slow == pytest.approx(want - 1e3 * 250 * 52 / 1e9 + 5.0, rel=1e-12)


# Leaves of the trainer's step (benchmarks/step_ranges.py) of two ranks: A 4 / 5, B 10 / 7, C 4 / 5 ms;
# the exchanges' own leaves and the collectives are not compute.
S0 = {"train/batch": 1, "distsplat/project": 2, "distsplat/count_exchange": 9, "distsplat/pack": 1,
      "distsplat/payload_exchange": 9, "distsplat/rasterize": 5, "train/loss": 1,
      "train/backward:before_exchange": 4, "distsplat/payload_exchange_backward": 9,
      "train/backward:after_exchange": 2, "train/divergence": 0.5, "train/optimizer": 0.5, "train/densify": 1,
      "collective": 50}
S1 = {"train/batch": 1, "distsplat/project": 3, "distsplat/pack": 1, "distsplat/rasterize": 3, "train/loss": 1,
      "train/backward:before_exchange": 3, "train/backward:after_exchange": 3, "train/divergence": 0.5,
      "train/optimizer": 0.5, "train/densify": 1, "collective": 70}


def test_segments_are_the_trainers_ranges_between_its_synchronization_points():
    assert (sg.segment(S0, "A"), sg.segment(S0, "B"), sg.segment(S0, "C")) == (4, 10, 4)
    assert (sg.segment(S1, "A"), sg.segment(S1, "B"), sg.segment(S1, "C")) == (5, 7, 5)
    # W = 1: no exchange, the whole backward is B; render time outside its ranges is A
    one = {"train/batch": 1, "train/render:other": 2, "train/backward": 6, "train/densify": 1}
    assert (sg.segment(one, "A"), sg.segment(one, "B"), sg.segment(one, "C")) == (3, 6, 1)


def test_model_step_is_slowest_a_plus_c_plus_slowest_b_plus_exchange():
    rec = _rec([S0, S1], [1000, 500], [500, 1000])
    assert sg.model_step(rec, None)["step_ms"] == pytest.approx(10 + 10)
    ours = sg.model_step(rec, LINK, "ours")
    # not recorded: the render's 3 collectives and 1 host sync
    x = sg.exchange_ms([1000, 500], [500, 1000], 2, 52, 52, LINK, 3, 1, extra_fixed_bytes=sg.COUNT_COLUMNS * 8)
    assert ours["exchange_ms"] == pytest.approx(x) and ours["step_ms"] == pytest.approx(20 + x)
    # recorded: the render's three and the divergence check's all-reduce (read on the host)
    coll = {"distsplat/count_exchange": 1, "distsplat/payload_exchange": 1,
            "distsplat/payload_exchange_backward": 1, "train/divergence": 1}
    ours4 = sg.model_step(_rec([S0, S1], [1000, 500], [500, 1000], collectives=[coll, coll]), LINK, "ours")
    x4 = sg.exchange_ms([1000, 500], [500, 1000], 2, 52, 52, LINK, 4, 2, extra_fixed_bytes=sg.COUNT_COLUMNS * 8)
    assert ours4["exchange_ms"] == pytest.approx(x4)
    gs = sg.model_step(rec, LINK, "gsplat")
    # gsplat: 7 collectives, 64 B forward + 40 B back per pair, 2 cameras' 100 B... + 12 host reads
    xg = (1e3 * (7 * 1e-5 + 3 * 2e-5 + 12 * sg.HOST_READ_S)
          + 1e3 * (1000 * 64 + 1 * (100 + 8)) / 1e9 + 1e3 * 1000 * 40 / 1e9)
    assert gs["exchange_ms"] == pytest.approx(xg, rel=1e-12)
    # gsplat on one GPU has no packing stage: A + C of S0 without its 1 ms of packing, and B
    one = sg.model_step(_rec([S0], [0], [0]), LINK, "gsplat")
    assert (one["step_ms"], one["exchange_ms"]) == (pytest.approx(3 + 4 + 10), 0.0)


def test_collectives_of_a_render_without_its_ranges_are_still_exchanges():
    """Before the render marks its ranges, its collectives are called from train/render:other
    and train/backward: they are the exchanges, not host reads."""
    coll = {"train/render:other": 2, "train/backward": 1, "train/divergence": 1}
    assert sg.collectives_and_reads({"collectives": [coll]}) == (4, 2)
    assert sg.collectives_and_reads({"collectives": []}) == (3, 1)


def test_speedups_are_w_times_t1_over_tw_per_batch():
    rows = []
    for W, b, t in ((1, 1, 10.0), (2, 1, 12.5), (1, 4, 40.0), (2, 4, 40.0)):
        pred = {s: {k: {"step_ms": t} for k in sg.LINKS} for s in ("ours", "gsplat")}
        rows.append({"W": W, "batch_per_rank": b, "compute_only_step_ms": t, "predicted": pred})
    sg.add_speedups(rows)
    assert rows[1]["predicted"]["ours"]["nvlink_h100"]["speedup"] == pytest.approx(1.6)
    assert rows[3]["predicted"]["gsplat"]["pcie4"]["speedup"] == pytest.approx(2.0)
    assert rows[0]["speedup_compute_only"] == pytest.approx(1.0)


def test_perturbed_cameras_keep_their_centres_and_rotations():
    c, s = math.cos(0.3), math.sin(0.3)
    base = np.eye(4, dtype=np.float32)[None].repeat(2, 0)
    base[1, :3, :3] = [[c, -s, 0], [s, c, 0], [0, 0, 1]]
    base[:, :3, 3] = [[0.5, -1.0, 2.0], [1.0, 0.0, -3.0]]
    out = sg.perturbed_cameras(base, 6, 8.0, seed=0)
    for i, m in enumerate(out):
        b = base[i % 2]
        R = m[:3, :3].astype(np.float64)
        np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-6)  # float32 storage: ~1e-7 per entry
        centre, centre0 = -R.T @ m[:3, 3], -b[:3, :3].T.astype(np.float64) @ b[:3, 3]
        np.testing.assert_allclose(centre, centre0, atol=1e-5)
        angle = math.degrees(math.acos(np.clip((np.trace(R @ b[:3, :3].T) - 1) / 2, -1, 1)))
        assert 0 < angle <= 16 + 1e-3  # yaw, pitch each within 8 deg: the angles add at most
