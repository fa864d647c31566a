"""The scaling model of the distributed step: the arithmetic that turns each rank's measured
segments into a predicted step time for W devices. The measurements come from
`scaling_gpu.py`, which runs W ranks of the real `Trainer` and times each rank's
`train_step` by its profiler ranges (on a GPU; on a CPU the same code checks its plumbing).
Until the lean-step work this module also ran its own "virtual ranks", a copy of the step
built from the distributed render's private pieces; that copy could drift from the trainer
and was removed (its results, scaling_model*.json, describe the code of their commits).

Model (steady state, each collective a synchronization point):
    T(W) = mk(A + C) + mk(B) + X(W)
    X(W) = 3 * latency + host_sync + 2 * max_r(max(bytes_sent_r, bytes_received_r)) / bandwidth
    mk(s) = max_r s_r                            one device per rank (GPUs)
    mk(s) = max_r s_r / min(1, k / W)            W processes sharing k cores (a CPU)
A_r: up to the count exchange and the payload all-to-all; B_r: the own cameras' rasterization,
loss and backward up to the reverse all-to-all; C_r: the rest (the projection's backward,
the optimizer, densification). The training throughput speedup (the global batch is
W x batch_size cameras) is W * T(1) / T(W).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from distsplat.distributed.exchange import N_COLUMNS  # noqa: E402

COUNT_COLUMNS = N_COLUMNS  # int64 per rank pair in the count exchange


# ------------------------------------------------------------------------------ the model


def makespan(seconds: Sequence[float], cores: Optional[float] = None) -> float:
    """Time until all ranks finish a segment of `seconds` compute each: the slowest rank
    with one device each (cores=None), or, with the W processes sharing `cores` cores
    (fewer than W, or a fraction of the machine), each running at a share
    min(1, cores / W) of a core."""
    if not seconds:
        return 0.0
    if cores is None:
        return max(seconds)
    return max(seconds) / min(1.0, cores / len(seconds))


def exchange_time(bytes_sent: Sequence[int], bytes_received: Sequence[int], bandwidth_Bps: float,
                  latency_s: float, host_sync_s: float) -> float:
    """Count all-to-all + payload all-to-all + reverse all-to-all (3 collectives), one
    host read of the counts, and the payload both ways at the busiest rank's volume."""
    if len(bytes_sent) <= 1:
        return 0.0
    busiest = max(max(s, r) for s, r in zip(bytes_sent, bytes_received))
    return 3 * latency_s + host_sync_s + 2 * busiest / bandwidth_Bps


def step_time(A: Sequence[float], B: Sequence[float], C: Sequence[float], exchange_s: float,
              cores: Optional[float] = None, compute_scale: float = 1.0) -> float:
    """T = mk(A + C) + mk(B) + X, compute divided by compute_scale."""
    ac = [(a + c) / compute_scale for a, c in zip(A, C)]
    b = [x / compute_scale for x in B]
    return makespan(ac, cores) + makespan(b, cores) + exchange_s


def speedup(t1: float, tW: float, W: int) -> float:
    """Throughput speedup at a per-rank batch: W times the images per step."""
    return W * t1 / tW
