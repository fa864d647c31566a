"""The memory guard across ranks: a rank near its limit stops growing while the others
keep growing, rebalancing does not push Gaussians onto it, and nobody waits on anybody
(the decision is per rank, with no collective of its own). Then the real CLI under
torchrun: a limit below usage and a cache budget too small for `--cache decoded` warn
with the numbers on every rank, and the run still finishes."""

from __future__ import annotations

import time

import pytest

from distsplat.train.model.strategies import DefaultStrategy
from torchrun_cli import TINY_FLAGS, torchrun
from trainer_workers import tiny_config


def test_only_the_full_rank_stops_growing(run_workers, tmp_path):
    cfg = tiny_config(str(tmp_path / "run"), max_steps=25, memory_limit_gb=1.0, strategy=DefaultStrategy(
        refine_start_iter=5, refine_every=5, refine_stop_iter=1000, reset_every=10_000, grow_grad2d=1e-5))
    t0 = time.monotonic()
    r0, r1 = run_workers("memory_workers:one_rank_full", 2, cfg, 1, timeout_s=120)
    assert time.monotonic() - t0 < 120  # both finished: no rank waited on the other
    assert r1["counts"] == [200] * 25 and r1["blocked"] and r1["transitions"] == 1
    assert r0["counts"][-1] >= 4 * 200 and not r0["blocked"]  # refines at 10, 15, 20 doubled it
    assert r0["final_counts"] == r1["final_counts"] == [r0["counts"][-1], 200]  # no rebalance onto rank 1
    stop = [m for m in r1["warnings"] if "stops growing" in m]
    assert len(stop) == 1 and stop[0].startswith("[rank 1] memory guard: densification stops growing on this "
                                                 "rank at 200 Gaussians: 2.00 GiB used")
    assert not any("stops growing" in m for m in r0["warnings"])
    held = [m for m in r0["warnings"] if "rebalancing waits" in m]  # rank 0 says it, once
    assert len(held) == 1 and "rank(s) [1] would receive Gaussians but are near their memory limit" in held[0]


@pytest.mark.slow
def test_cli_warns_with_the_numbers_and_finishes(tmp_path):
    out = tmp_path / "run"
    p = torchrun(["default", "--max_steps", "30", "--eval_steps", "30", "--save_steps", "30", "--log_every", "10",
                  "--result_dir", str(out), *TINY_FLAGS, "--strategy.refine_start_iter", "5",
                  "--strategy.refine_every", "10", "--strategy.grow_grad2d", "1e-5",
                  "--memory_limit_gb", "0.01", "--cache", "decoded", "--cache_budget_gb", "0.00001"])
    assert p.returncode == 0, p.stderr[-3000:]
    err = p.stderr
    for r in (0, 1):
        assert f"[rank {r}] image cache: --cache decoded for 6 own cameras: its decoded share (13.5 KiB)" in err
        assert f"[rank {r}] memory guard: the 200 initial Gaussians need" in err
        assert f"[rank {r}] memory guard: densification stops growing on this rank at 200 Gaussians" in err
    assert "does not fit its RAM budget (10.5 KiB); using none instead (no images held)" in err
    assert "memory guard: growth stops past 90% of 10.2 MiB per rank (--memory_limit_gb 0.01)" in err
    assert "Gaussians 400 in" in p.stdout  # the final line: nothing grew
