"""benchmarks/scaling_gpu.py's plumbing with two ranks (SMALL=1 on the CPU): W gloo processes
taking turns on the device, each running Trainer.train_step under the profiler; the JSON that
make_report reads, and each rank's parameters equal those of the same steps by
Trainer.train_step alone (SCALING_SELF_CHECK). Its W = 1 path and model arithmetic are
checked in tests/unit/test_bench_trainer_step.py and test_scaling_gpu.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_scaling_gpu_small_run_two_ranks_take_turns_and_step_as_the_trainer(tmp_path):
    """SMALL=1 with W = 1 and 2 (two gloo processes taking turns): the JSON make_report reads,
    and each rank's steps end with the parameters of Trainer.train_step alone (SCALING_SELF_CHECK)."""
    from tests.conftest import SHARED_DATA

    if not (SHARED_DATA / "test_garden.npz").is_file():  # the benchmark's scene is made from it
        pytest.skip(f"{SHARED_DATA / 'test_garden.npz'} not found (set DISTSPLAT_DATA; see tests/conftest.py)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "BENCH_RESULTS": str(tmp_path), "SMALL": "1",
           "SMALL_SIZE": "300,24,16", "WS": "1,2", "BATCHES": "1", "SCALING_WARMUP": "1", "SCALING_STEPS": "2",
           "SCALING_SELF_CHECK": "1"}
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "scaling_gpu.py")], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    d = json.loads((tmp_path / "scaling_gpu_small.json").read_text())
    rows = {r["W"]: r for r in d["results"]}
    assert set(rows) == {1, 2}
    # the configurations in their seeded shuffle, as run; both makespans per row, in the summary line too
    from benchmarks import scaling_gpu as sg

    assert d["order"]["ran"] == d["order"]["planned"] == [list(c) for c in sg.config_order([1, 2], [1], 0)]
    assert d["speedups_missing"] == [] and d["truncated"] == []
    summary = p.stdout.strip().splitlines()[-1]
    for r in rows.values():
        assert 0 < r["makespan_of_medians_ms"] and r["mean_of_step_makespans_ms"] == pytest.approx(
            r["compute_only_step_ms"], abs=1e-3)
        assert r["imbalance"] == pytest.approx(r["mean_of_step_makespans_ms"] / r["makespan_of_medians_ms"], rel=1e-3)
        assert f"W{r['W']}b1 {r['makespan_of_medians_ms']:.2f}/{r['mean_of_step_makespans_ms']:.2f}" in summary
    assert rows[1]["same_as_plain_trainer"] == [True] and rows[2]["same_as_plain_trainer"] == [True, True]
    two = rows[2]
    assert len(two["per_rank_ms"]) == 2 and all(s["A"] > 0 and s["B"] > 0 and s["C"] > 0 for s in two["per_rank_ms"])
    assert sum(two["bytes_sent"]) > 0 and "speedup" in two["predicted"]["ours"]["nvlink_h100"]
    # the render's collectives (under its ranges, or train/render / train/backward before it marks them:
    # exchanges) and the step's others (the divergence check's all-reduce: each read on the host)
    for c in two["collectives_last_step"]:
        render = sum(v for k, v in c.items() if k.startswith(sg.RENDER_LEAVES))
        assert render >= 3 and c == two["collectives_last_step"][0]
    n = sum(c.values())
    assert two["collectives_and_host_syncs_modelled"] == [n, 1 + n - render]
    from benchmarks import make_report

    d["_stale"] = False
    section = make_report.section_gpu_model(d)
    assert "GPU-timed scaling prediction" in section and "makespan of medians ms" in section
    assert "Order (seed 0): " in section
    assert "2-GPU speedup" in make_report.gpu_headline(d)
