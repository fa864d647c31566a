"""scaling_gpu.py's model arithmetic and camera construction (CPU only, no timing): the
GPU-timed prediction is only as good as these few formulas."""

import math

import numpy as np
import pytest

from benchmarks import scaling_gpu as sg

LINK = {"bandwidth_Bps": 1e9, "latency_s": 1e-5, "host_sync_s": 2e-5}


def _rec(stages, sent, received, bpp=52, b=1):
    W = len(stages)
    return {"stages_ms": stages, "pairs_sent": sent, "pairs_received": received, "bytes_per_pair": bpp,
            "pair_matrix": [[0] * W for _ in range(W)], "cameras_per_rank": b}


def test_exchange_is_zero_on_one_rank_and_adds_latency_syncs_and_the_busiest_ranks_bytes():
    assert sg.exchange_ms([0], [0], 1, 52, 52, LINK, 3, 1) == 0.0
    # busiest rank: max(max(100, 40), max(60, 250)) = 250 pairs
    got = sg.exchange_ms([100, 60], [40, 250], 2, 52, 40, LINK, 3, 1)
    want = 1e3 * (3 * 1e-5 + 2e-5) + 1e3 * 250 * 52 / 1e9 + 1e3 * 250 * 40 / 1e9
    assert got == pytest.approx(want, rel=1e-12)
    # a measured device copy slower than the link is the floor of that direction
    slow = sg.exchange_ms([100, 60], [40, 250], 2, 52, 40, LINK, 3, 1, copy_fwd_ms=5.0)
    assert slow == pytest.approx(want - 1e3 * 250 * 52 / 1e9 + 5.0, rel=1e-12)


def test_model_step_is_slowest_a_plus_c_plus_slowest_b_plus_exchange():
    s0 = {"activate": 1, "project": 2, "pack": 1, "raster_fwd": 5, "loss_fwd": 1, "raster_bwd": 4,
          "project_bwd": 2, "adam": 1, "densify": 1}  # A 4, B 10, C 4
    s1 = {"activate": 1, "project": 3, "pack": 1, "raster_fwd": 3, "loss_fwd": 1, "raster_bwd": 3,
          "project_bwd": 3, "adam": 1, "densify": 1}  # A 5, B 7, C 5
    rec = _rec([s0, s1], [1000, 500], [500, 1000])
    assert sg.model_step(rec, None)["step_ms"] == pytest.approx(10 + 10)
    ours = sg.model_step(rec, LINK, "ours")
    x = sg.exchange_ms([1000, 500], [500, 1000], 2, 52, 52, LINK, 3, 1, extra_fixed_bytes=sg.COUNT_COLUMNS * 8)
    assert ours["exchange_ms"] == pytest.approx(x) and ours["step_ms"] == pytest.approx(20 + x)
    gs = sg.model_step(rec, LINK, "gsplat")
    # gsplat: 7 collectives, 64 B forward + 40 B back per pair, 2 cameras' 100 B... + 12 host reads
    xg = (1e3 * (7 * 1e-5 + 3 * 2e-5 + 12 * sg.HOST_READ_S)
          + 1e3 * (1000 * 64 + 1 * (100 + 8)) / 1e9 + 1e3 * 1000 * 40 / 1e9)
    assert gs["exchange_ms"] == pytest.approx(xg, rel=1e-12)
    # gsplat on one GPU has no packing stage: A + C of s0 without its 1 ms of packing, and B
    one = sg.model_step(_rec([s0], [0], [0]), LINK, "gsplat")
    assert (one["step_ms"], one["exchange_ms"]) == (pytest.approx(3 + 4 + 10), 0.0)


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
