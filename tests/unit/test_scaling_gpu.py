"""scaling_gpu.py's model arithmetic and camera construction (CPU only, no timing): the
GPU-timed prediction is only as good as these few formulas. Then its loop with the rank runs
stood in: the configurations' shuffled order, the time limit (W = 1 always runs) and both
makespans in the JSON and the summary line. Its runs of the trainer's step are checked in
test_bench_trainer_step.py and tests/distributed/test_bench_scaling.py."""

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


def test_every_configuration_is_shuffled_by_its_seed():
    ws, batches = [1, 2, 4, 8], [1, 4]
    every = [(W, b) for W in ws for b in batches]
    orders = {seed: sg.config_order(ws, batches, seed) for seed in range(5)}
    for seed, order in orders.items():
        assert sorted(order) == sorted(every) and order == sg.config_order(ws, batches, seed)
    assert len({tuple(o) for o in orders.values()}) > 1
    assert any(o[0][0] != 1 for o in orders.values()), "W = 1 is shuffled with the rest, not run first"


def test_past_the_time_limit_only_w1_starts_and_the_speedups_it_cut_are_named():
    assert sg.runs_now(4, 10.0, 20.0) and not sg.runs_now(4, 21.0, 20.0)
    assert sg.runs_now(1, 1e9, 20.0)  # every speedup divides by W = 1
    rows = [{"W": 1, "batch_per_rank": 1}, {"W": 4, "batch_per_rank": 1}, {"W": 4, "batch_per_rank": 4}]
    assert sg.speedups_missing(rows, [1, 4], [1, 4]) == ["W=4 b=4: no W=1 b=4 row"]
    assert sg.speedups_missing(rows[:1], [1, 2, 4], [1, 4]) == [
        "W=2 b=1: no W=2 b=1 row", "W=4 b=1: no W=4 b=1 row", "W=2 b=4: no W=2 b=4 row and no W=1 b=4 row",
        "W=4 b=4: no W=4 b=4 row and no W=1 b=4 row"]
    assert sg.speedups_missing(rows + [{"W": 1, "batch_per_rank": 4}], [1, 4], [1, 4]) == []


def _steps(*per_step):
    """Records of steps, each [(A, B, C, own step, collective ms) per rank]."""
    return [{"stages_ms": [{"train/batch": a, "distsplat/rasterize": b, "train/optimizer": c, "collective": x}
                           for a, b, c, _, x in ranks],
             "step_ms": [own + x for _, _, _, own, x in ranks]} for ranks in per_step]


def test_makespan_of_medians_and_mean_of_step_makespans():
    # rank 0 slow in step 1, rank 1 in steps 2 and 3: every rank's medians are small, the steps' makespans not
    recs = _steps([(1, 10, 1, 12, 50), (1, 4, 1, 6, 60)],
                  [(1, 4, 1, 6, 50), (1, 10, 1, 12, 60)],
                  [(1, 4, 1, 6, 50), (3, 10, 1, 14, 60)])
    got = sg.makespans(recs)
    # max_r med(A + C) = max(2, 2) and max_r med(B) = max(4, 10); per step: 2+10, 2+10, 4+10
    assert got["makespan_of_medians_ms"] == pytest.approx(12)
    assert got["mean_of_step_makespans_ms"] == pytest.approx((12 + 12 + 14) / 3, abs=1e-4)  # rounded to 0.1 us
    assert got["imbalance"] == pytest.approx((38 / 3) / 12, abs=1e-4)
    # own step (collectives taken out): medians 6 and 12; per step 12, 12, 14
    assert got["own_step"]["makespan_of_medians_ms"] == pytest.approx(12)
    assert got["own_step"]["mean_of_step_makespans_ms"] == pytest.approx(38 / 3, abs=1e-4)
    # the mean of the steps' makespans is the compute-only step the speedup uses
    assert got["mean_of_step_makespans_ms"] == pytest.approx(
        sum(sg.model_step(r, None)["step_ms"] for r in recs) / 3, abs=1e-4)


def _fake_world(calls):
    """run_world's stand-in: W ranks' results of the one batch asked, 3 steps each."""
    from benchmarks import step_ranges as sr

    def run_world(W, job):
        (b,) = job["batches"]
        calls.append((W, b))
        step = {"leaves": {"train/batch": 1.0 * b, "distsplat/rasterize": 2.0 * b, "train/optimizer": 1.0},
                "step_ms": 4.0 * b, "collectives": {}, "seen": list(sr.expected(W)), "device_ops": 0,
                "comm": {"pairs_projected": 10, "pairs_sent": 5, "pairs_received": 5, "pairs_rendered": 10,
                         "bytes_per_pair": 52}}
        return [[{"batch": b, "rank": r, "gaussians": 100 // W, "n_all": 100, "image": [8, 6], "ssim_impl": "torch",
                  "steps": [dict(step) for _ in range(3)]}] for r in range(W)]

    return run_world


@pytest.mark.parametrize("limit", ["1e9", "-1"], ids=["in_time", "past_the_limit"])
def test_main_runs_the_configurations_in_their_shuffled_order_and_reports_both_makespans(
        tmp_path, monkeypatch, capsys, limit):
    """scaling_gpu.main's loop with the rank runs stood in (no trainer): the order run and recorded,
    per row both makespans and their ratio, in the JSON and the summary line; past TIME_LIMIT_S
    only the W = 1 configurations run, and the speedups that need the others are named."""
    import json

    from benchmarks import common

    calls = []
    monkeypatch.setattr(sg, "run_world", _fake_world(calls))
    monkeypatch.setattr(sg, "run_memo_setup", lambda memo, job, device: setattr(memo, "scene", "scene"))
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setenv("BENCH_RESULTS", str(tmp_path))  # a staging folder: <name>.json, not a dated snapshot
    (tmp_path / "scene").mkdir()
    for k, v in {"SCENE": str(tmp_path / "scene"), "WS": "1,2", "BATCHES": "1,4", "SCALING_ORDER_SEED": "3",
                 "TIME_LIMIT_S": limit}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SMALL", raising=False)
    sg.main()
    d = json.loads((tmp_path / "scaling_gpu.json").read_text())
    planned = [tuple(c) for c in d["order"]["planned"]]
    assert d["order"]["seed"] == 3 and planned == sg.config_order([1, 2], [1, 4], 3)
    if limit == "1e9":
        assert calls == planned and [tuple(c) for c in d["order"]["ran"]] == planned
        assert d["speedups_missing"] == [] and d["truncated"] == []
    else:
        assert calls == [c for c in planned if c[0] == 1]
        assert sorted(d["truncated"]) == ["W=2 b=1: skipped, past TIME_LIMIT_S=-1",
                                          "W=2 b=4: skipped, past TIME_LIMIT_S=-1"]
        assert d["speedups_missing"] == ["W=2 b=1: no W=2 b=1 row", "W=2 b=4: no W=2 b=4 row"]
    out = capsys.readouterr().out.splitlines()[-1]
    for row in d["results"]:
        W, b = row["W"], row["batch_per_rank"]
        assert row["makespan_of_medians_ms"] == pytest.approx(3.0 * b + 1)  # A + C = b + 1, B = 2b, every rank
        assert row["mean_of_step_makespans_ms"] == pytest.approx(row["compute_only_step_ms"])
        assert row["imbalance"] == pytest.approx(1.0) and row["own_step"]["imbalance"] == pytest.approx(1.0)
        assert f"W{W}b{b} {row['makespan_of_medians_ms']:.2f}/{row['mean_of_step_makespans_ms']:.2f}=1.000" in out
    assert "makespan of medians / mean of step makespans" in out
    assert ("SPEEDUPS MISSING" in out) == (limit == "-1")
