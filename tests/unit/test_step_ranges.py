"""benchmarks/step_ranges.py: how the GPU benchmarks read the trainer's step from its
profiler ranges (leaves, the step's time with device work, collectives, syncs, missing
ranges) and how ranks sharing one device take turns. On the CPU: made-up profiles with
kernels, and a real profile of a tiny Trainer's steps."""

import tempfile
import threading
import warnings

import pytest
import torch
import torch.distributed as dist

from benchmarks import step_ranges as sr
from benchmarks.step_ranges import SYNC_WARNING, SyncCounter

S, D = sr.Span, sr.DeviceOp


def _step(t0, names_and_times):
    """Consecutive ranges from t0 (us): [(name, duration)] -> spans, wrapped in a bench/step."""
    spans, t = [], t0
    for name, dur in names_and_times:
        spans.append(S(name, t, t + dur))
        t += dur
    return [S(sr.STEP, t0, t)] + spans


def test_host_only_leaves_are_the_ranges_and_add_up_to_the_step():
    spans = _step(0, [("train/batch", 100), ("train/render", 1000), ("train/loss", 300), ("train/backward", 900),
                      ("train/divergence", 50), ("train/optimizer", 100), ("train/densify", 50)])
    spans += [S("distsplat/project", 100, 400), S("distsplat/rasterize", 600, 1100)]
    (rec,) = sr.analyse(spans)
    # the render's time outside its own ranges (400..600 us) is train/render:other
    assert rec["leaves"] == pytest.approx({"train/batch": 0.1, "distsplat/project": 0.3, "train/render:other": 0.2,
                                           "distsplat/rasterize": 0.5, "train/loss": 0.3, "train/backward": 0.9,
                                           "train/divergence": 0.05, "train/optimizer": 0.1, "train/densify": 0.05})
    assert rec["step_ms"] == pytest.approx(2.5) == sum(rec["leaves"].values())
    assert rec["ranges"]["train/render"] == pytest.approx(1.0)  # its leaves, nested ranges included
    assert rec["cpu_ms"] == rec["leaves"] and rec["device_ms"] == {}
    assert sr.missing([rec], sr.expected(1)) == []
    assert sr.missing([rec], sr.expected(2)) == ["distsplat/count_exchange", "distsplat/pack",
                                                 "distsplat/payload_exchange", "distsplat/payload_exchange_backward"]


def test_device_work_counts_where_it_was_launched_and_the_step_ends_with_its_last_kernel():
    # host: batch 0-100, render 100-200, loss 200-300; kernels launched in render run 150-700
    # (GPU-bound): the render's leaf holds them, the loss's host time hides under them
    spans = _step(0, [("train/batch", 100), ("train/render", 100), ("train/loss", 100)])
    ops = [D("k1", 120, 150, 400), D("k2", 180, 400, 700), D("k3", 250, 700, 720)]
    (rec,) = sr.analyse(spans, ops, kernels=True)
    assert rec["leaves"] == pytest.approx({"train/batch": 0.1, "train/render:other": 0.6, "train/loss": 0.02})
    assert rec["step_ms"] == pytest.approx(0.72)
    assert rec["device_ms"] == pytest.approx({"train/batch": 0.0, "train/render:other": 0.55, "train/loss": 0.02})
    assert rec["kernels"]["train/render:other"] == pytest.approx({"k1": 0.25, "k2": 0.3})
    assert rec["device_ops"] == 3


def test_a_step_that_starts_while_the_device_still_runs_the_last_one_is_not_charged_twice():
    spans = _step(0, [("train/batch", 100)]) + _step(200, [("train/batch", 100)])
    ops = [D("k", 50, 60, 260)]  # the first step's kernel runs into the second step's host time
    a, b = sr.analyse(spans, ops)
    assert a["step_ms"] == pytest.approx(0.26) and b["step_ms"] == pytest.approx(0.04)  # 260..300


def test_backward_splits_at_the_payload_exchange_and_collectives_are_set_aside():
    spans = _step(0, [("train/render", 400), ("train/backward", 600), ("train/divergence", 100)])
    spans += [S("distsplat/count_exchange", 100, 200), S(sr.COLLECTIVE, 120, 180),
              S("distsplat/payload_exchange_backward", 700, 800), S(sr.COLLECTIVE, 720, 780),
              S(sr.COLLECTIVE, 1020, 1080)]
    (rec,) = sr.analyse(spans)
    leaves = rec["leaves"]
    assert leaves["train/backward:before_exchange"] == pytest.approx(0.3)  # 400..700
    assert leaves["train/backward:after_exchange"] == pytest.approx(0.2)  # 800..1000
    assert leaves["collective:distsplat/count_exchange"] == pytest.approx(0.06)
    assert leaves["distsplat/count_exchange"] == pytest.approx(0.04)
    assert leaves["collective:train/divergence"] == pytest.approx(0.06)
    assert rec["collectives"] == {"distsplat/count_exchange": 1, "distsplat/payload_exchange_backward": 1,
                                  "train/divergence": 1}
    assert rec["ranges"]["train/backward"] == pytest.approx(0.6)


def test_sync_marks_are_counted_in_their_range():
    spans = _step(0, [("train/render", 100), ("train/loss", 100)])
    spans += [S(sr.SYNC, 50, 50), S(sr.SYNC, 150, 150), S(sr.SYNC, 160, 160)]
    (rec,) = sr.analyse(spans)
    assert rec["syncs"] == {"train/render:other": 1, "train/loss": 2}
    assert sum(rec["leaves"].values()) == pytest.approx(0.2)


def test_staged_marks_are_counted_apart_from_syncs_and_cut_no_leaf():
    """count_syncs' W = 2 case: a staged collective's host transfer (bench/staged) is also a sync
    (bench/sync); the two are counted side by side, per leaf, and neither splits a leaf."""
    spans = _step(0, [("train/render", 400), ("train/backward", 300)])
    spans += [S("distsplat/count_exchange", 100, 200), S("distsplat/payload_exchange", 250, 350),
              S("distsplat/payload_exchange_backward", 500, 600)]
    for t in (150, 300, 550):  # each staged transfer syncs
        spans += [S(sr.STAGED, t, t), S(sr.SYNC, t, t)]
    spans += [S(sr.SYNC, 650, 650)]  # a sync of its own (a host read after the exchange)
    (rec,) = sr.analyse(spans)
    assert rec["staged"] == {"distsplat/count_exchange": 1, "distsplat/payload_exchange": 1,
                             "distsplat/payload_exchange_backward": 1}
    assert rec["syncs"] == {**rec["staged"], "train/backward:after_exchange": 1}
    assert set(rec["leaves"]) == {"distsplat/count_exchange", "distsplat/payload_exchange", "train/render:other",
                                  "train/backward:before_exchange", "distsplat/payload_exchange_backward",
                                  "train/backward:after_exchange"}
    assert rec["leaves"]["distsplat/payload_exchange"] == pytest.approx(0.1)


def _tiny_trainer():
    from distsplat.distributed import init_distributed
    from distsplat.train.config import Config, SyntheticConfig
    from distsplat.train.model.strategies import DefaultStrategy
    from distsplat.train.trainer import Trainer

    cfg = Config(result_dir=tempfile.mkdtemp(), max_steps=20, eval_steps=[], save_steps=[], save_ply=False,
                 sh_degree=1, sh_degree_interval=10, num_workers=1, prefetch=1, batch_size=1,
                 seed=3, strategy=DefaultStrategy(refine_start_iter=10_000, refine_stop_iter=0, reset_every=10_000),
                 synthetic=SyntheticConfig(kind="ball", num_cameras=8, num_gaussians=200, width=24, height=16, seed=1))
    cfg.validate()
    t = Trainer(cfg, init_distributed(device=torch.device("cpu")))
    t.setup()
    return t


def test_a_real_profile_of_the_trainers_steps_has_its_ranges_and_a_sync_mark_lands_in_its_range():
    t = _tiny_trainer()
    try:
        t.train_step(0)
        counter = SyncCounter(cuda=False)

        def step(s):
            counter.start()
            real = t.strategy.step_pre_backward

            def warn_inside(*args, **kwargs):  # inside train/loss: as a CUDA sync would warn
                warnings.warn(f"called a {SYNC_WARNING}")
                return real(*args, **kwargs)

            t.strategy.step_pre_backward = warn_inside
            try:
                t.train_step(s)
            finally:
                del t.strategy.step_pre_backward
                counted.append(counter.stop())

        counted = []
        records, _ = sr.profile_steps(step, [1, 2], torch.device("cpu"))
    finally:
        t.cleanup()
    assert len(records) == 2
    for rec in records:
        assert set(sr.STEP_RANGES) <= set(rec["seen"])
        assert sum(rec["leaves"].values()) == pytest.approx(rec["step_ms"])
        assert rec["syncs"] == {"train/loss": 1}
    assert [c["count"] for c in counted] == [1, 1] and "test_step_ranges.py" in next(iter(counted[0]["where"]))
    # what this render does not mark is reported, not raised
    assert set(sr.missing(records, sr.expected(2))) >= {"distsplat/payload_exchange_backward"}


def test_taking_turns_holds_the_token_except_inside_a_collective(monkeypatch):
    token = threading.Lock()
    held = []
    fake = lambda *a, **k: held.append(token.locked()) or "done"  # noqa: E731
    monkeypatch.setattr(dist, "all_reduce", fake)
    with sr.taking_turns(token, torch.device("cpu")):
        assert token.locked() and dist.all_reduce is not fake
        assert dist.all_reduce("x") == "done"
        assert token.locked()
    assert held == [False] and not token.locked() and dist.all_reduce is fake
    with sr.taking_turns(None, torch.device("cpu")):  # one rank: nothing to take turns with
        assert dist.all_reduce is fake


def test_profiler_events_become_spans_and_device_ops_launched_where_their_runtime_call_was():
    """spans_and_ops on a made-up CUDA profile (the CPU has none): a kernel's launch is the host
    time of its runtime call (same correlation id), else of the op it is linked to, else its
    own start; the device side of a user annotation is no op."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def ev(name, start, end, device=DeviceType.CPU, id=0, linked=0, annotation=False):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), device_type=device,
                               id=id, linked_correlation_id=linked, is_user_annotation=annotation)

    CUDA = DeviceType.CUDA
    events = [
        ev("train/render", 0, 100, annotation=True, id=1),
        ev("Optimizer.step#Adam.step", 100, 150, annotation=True, id=2),
        ev("aten::mul", 10, 30, id=3),
        ev("cudaLaunchKernel", 20, 22, id=900, linked=3),  # the runtime call of kernel 900
        ev("mul_kernel", 200, 210, device=CUDA, id=900, linked=3),
        ev("add_kernel", 220, 230, device=CUDA, id=901, linked=3),  # no runtime event: its op's start
        ev("lonely_kernel", 240, 250, device=CUDA, id=902, linked=77),  # linked to nothing known: own start
        ev("train/render", 0, 300, device=CUDA, annotation=True),  # gpu_user_annotation
        ev("Optimizer.step#Adam.step", 200, 300, device=CUDA),  # ... without the flag
    ]
    spans, ops = sr.spans_and_ops(SimpleNamespace(events=lambda: events))
    assert spans == [S("train/render", 0, 100)]
    assert ops == [D("mul_kernel", 20, 200, 210), D("add_kernel", 10, 220, 230), D("lonely_kernel", 240, 240, 250)]
