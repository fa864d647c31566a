"""faults.py on one process (issue 21): the divergence check and the save guard's decisions,
with no process group (the collectives are the identity at W = 1); the check's device side
(fused Adam's found_inf, the masked densification statistics and MCMC noise) and its lazy
host read. The 2-rank behaviour
is tested under torchrun in tests/distributed/test_disk_full.py and test_divergence.py."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import torch

from distsplat.distributed import DistContext
from distsplat.train.files.save_guard import SaveGuard, payload_bytes
from distsplat.train.guards.disk_full import is_disk_full
from distsplat.train.guards.faults import READ_LAG, DivergenceGuard, FlagReader

CTX = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


def params_with_grads(**grads):
    params = {k: torch.nn.Parameter(torch.zeros(4, 3)) for k in ("means", "scales")}
    for k, g in grads.items():
        params[k].grad = g
    return params


def checked(guard, step, loss, params):
    """check() then the host's read of its flags (poll, as the trainer's loop after a step)."""
    found = guard.check(step, loss, params)
    guard.poll(step + 1, flush=False)
    return found


@pytest.mark.parametrize("bad", ["nan_loss", "inf_loss", "nan_grad", "inf_grad", "none"])
def test_divergence_guard_flags_any_non_finite_loss_or_gradient(bad):
    loss = torch.tensor({"nan_loss": float("nan"), "inf_loss": float("inf")}.get(bad, 0.5))
    grad = torch.ones(4, 3)
    if bad in ("nan_grad", "inf_grad"):
        grad[2, 1] = float("nan") if bad == "nan_grad" else -float("inf")
    guard = DivergenceGuard(CTX, torch.device("cpu"), max_bad_steps=2)
    found = checked(guard, 7, loss, params_with_grads(means=grad))
    assert found.shape == () and found.dtype == torch.float32 and float(found) == (bad != "none")
    assert guard.found is found
    assert guard.in_a_row == (bad != "none") and not guard.diverged


def test_divergence_guard_counts_in_a_row_and_resets_on_a_good_step():
    guard = DivergenceGuard(CTX, torch.device("cpu"), max_bad_steps=3)
    nan, ok = torch.tensor(float("nan")), torch.tensor(1.0)
    p = params_with_grads(means=torch.ones(4, 3))
    assert [float(checked(guard, s, loss, p)) for s, loss in enumerate([nan, nan, ok, nan, nan])] == [1, 1, 0, 1, 1]
    assert guard.in_a_row == 2 and guard.first_bad == 3 and not guard.diverged
    guard.check(5, nan, p)
    assert guard.poll(6, flush=False) and guard.diverged  # on CPU: read and decided at once
    msg = str(guard.error(True, Path("/r/ckpts/step_000006"), "no checkpoint is complete yet"))
    assert msg.startswith("training diverged: 3 steps in a row (steps 3 to 5)") and "--ckpt /r/ckpts/step_000006" in msg


def test_divergence_guard_off_checks_nothing():
    guard = DivergenceGuard(CTX, torch.device("cpu"), max_bad_steps=0)
    assert guard.check(0, torch.tensor(float("nan")), params_with_grads()) is None and guard.found is None
    assert not guard.poll(1, flush=True) and not guard.diverged and len(guard.reader) == 0


class FakeEvents:
    """Stand-ins for CUDA events: event i completes when the test says (or is waited for)."""

    def __init__(self):
        self.done, self.waited, self.made = set(), [], 0

    def __call__(self):
        i, self.made = self.made, self.made + 1
        events = self

        class Event:
            def query(self):
                return i in events.done

            def synchronize(self):
                events.waited.append(i)
                events.done.add(i)

        return Event()


def test_flag_reader_reads_in_step_order_and_waits_only_when_told():
    events = FakeEvents()
    reader = FlagReader(torch.device("cpu"), events=events)
    for step in range(4):
        reader.push(step, torch.tensor([0.0, float(step == 2)]))
    events.done |= {1, 2}
    assert reader.pop() is None  # step 0's copy has not landed: nothing after it is read either
    events.done.add(0)
    assert [reader.pop(), reader.pop(), reader.pop()] == [(0, [0.0, 0.0]), (1, [0.0, 0.0]), (2, [0.0, 1.0])]
    assert reader.pop(wait_before=3) is None and events.waited == []  # step 3 is not before 3: not waited for
    assert reader.pop(wait_before=4) == (3, [0.0, 0.0]) and events.waited == [3]
    assert reader.pop(wait_before=100) is None and len(reader) == 0


def test_divergence_guard_reads_lazily_and_everything_at_a_flush(caplog):
    """On CUDA the flags are read once their copy has landed, in order; a flush (log, save,
    eval steps, the end) waits for all of them; the stop is decided on flags every rank
    has read (steps before done - READ_LAG, or all at a flush)."""
    events = FakeEvents()
    guard = DivergenceGuard(CTX, torch.device("cpu"), max_bad_steps=2)
    guard.reader = FlagReader(torch.device("cpu"), events=events)
    nan, ok = torch.tensor(float("nan")), torch.tensor(1.0)
    p = params_with_grads(means=torch.ones(4, 3))
    with caplog.at_level(logging.WARNING, logger="distsplat.train.guards.faults"):
        for step, loss in enumerate([ok, nan, nan]):
            guard.check(step, loss, p)
            assert not guard.poll(step + 1, flush=False)  # nothing landed, nothing waited for
        assert guard.in_a_row == 0 and events.waited == [] and "skipped" not in caplog.text
        events.done |= {0, 1}
        assert not guard.poll(3, flush=False)
        assert guard.in_a_row == 1 and guard.first_bad == 1 and "step 1 skipped" in caplog.text
        events.done.add(2)
        # diverged at step 2, but step 2 is not before the agreed done - READ_LAG: no stop yet
        assert not guard.poll(3, flush=False) and guard.diverged
        assert guard.poll(3 + READ_LAG, flush=False)
        guard.check(3, ok, p)  # a good step after divergence does not hide it
        assert guard.poll(4, flush=True) and guard.diverged and guard.last_bad == 2 and len(guard.reader) == 1
    events2 = FakeEvents()
    guard = DivergenceGuard(CTX, torch.device("cpu"), max_bad_steps=5)
    guard.reader = FlagReader(torch.device("cpu"), events=events2)
    for step in range(3):
        guard.check(step, nan if step else ok, p)
    assert not guard.poll(3, flush=True) and events2.waited == [0, 1, 2] and len(guard.reader) == 0
    assert guard.in_a_row == 2 and guard.skipped == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_found_inf_skips_the_fused_adam_update_and_its_step_on_cpu(dtype):
    """create_optimizers' Adam is fused on CPU too; found_inf = 1 leaves the parameters,
    moments and step count untouched (NaN gradients included); found_inf = 0 is a plain step."""
    from distsplat.train.model.gaussians import adam_step, create_optimizers, init_gaussians

    def model():
        params = init_gaussians(torch.randn(50, 3, generator=torch.Generator().manual_seed(0)),
                                torch.rand(50, 3, generator=torch.Generator().manual_seed(1)), 1, (0, 50))
        for k in params:
            params[k] = torch.nn.Parameter(params[k].detach().to(dtype))
        return params, create_optimizers(params, global_batch=2)

    def grads(params, bad):
        g = torch.Generator().manual_seed(2)
        for p in params.values():
            p.grad = torch.randn(p.shape, generator=g, dtype=dtype)
            if bad:
                p.grad.view(-1)[0] = float("nan")

    params, opts = model()
    ref_params, ref_opts = model()
    assert all(o.defaults["fused"] for o in opts.values())
    for step in range(2):  # some state first
        for ps, os_ in ((params, opts), (ref_params, ref_opts)):
            grads(ps, False)
            for o in os_.values():
                adam_step(o, torch.tensor(0.0) if ps is params else None)
    before = {k: (p.detach().clone(), {n: v.clone() for n, v in opts[k].state[p].items()}) for k, p in params.items()}
    grads(params, True)
    for o in opts.values():
        adam_step(o, torch.tensor(1.0))
        assert not hasattr(o, "found_inf")  # GradScaler's protocol: set for the step only
    for k, p in params.items():
        assert torch.equal(p, before[k][0]), k
        for n, v in opts[k].state[p].items():
            assert torch.equal(v, before[k][1][n]), (k, n)
        assert int(opts[k].state[p]["step"]) == 2
        assert torch.equal(p, ref_params[k]), k  # found_inf = 0 stepped exactly like no found_inf


def _strategy_info(packed: bool, bad: bool, seed: int = 0):
    """A render's densification info for 20 Gaussians in 2 cameras: means2d with a gradient
    (NaN where `bad`), radii, ids, as the trainer's merged meta holds them."""
    g = torch.Generator().manual_seed(seed)
    C, N = 2, 20
    radii = (torch.rand(C, N, 2, generator=g) * 6).round()  # [C, N, 2], some 0: not visible
    if packed:
        cams, ids = torch.where((radii > 0).all(-1))
        means2d = torch.zeros(len(ids), 2, requires_grad=True)
        means2d.grad = torch.randn(len(ids), 2, generator=g)
        radii = radii[cams, ids]
    else:
        ids = None
        means2d = torch.zeros(C, N, 2, requires_grad=True)
        means2d.grad = torch.randn(C, N, 2, generator=g)
    means2d.absgrad = means2d.grad.abs()
    if bad:
        means2d.grad.view(-1)[1] = float("nan")
        means2d.absgrad.view(-1)[1] = float("nan")
    return {"width": 32, "height": 24, "n_cameras": C, "radii": radii, "gaussian_ids": ids, "means2d": means2d}


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("absgrad", [False, True])
def test_default_strategy_statistics_equal_gsplat_on_a_good_step_and_ignore_a_bad_one(packed, absgrad):
    from gsplat.strategy import DefaultStrategy as GsplatDefaultStrategy

    from distsplat.train.model.strategies import DefaultStrategy

    ours = DefaultStrategy(refine_scale2d_stop_iter=1000, absgrad=absgrad)
    params = {"means": torch.zeros(20, 3)}
    state, ref = ours.initialize_state(), ours.initialize_state()
    for step in range(3):
        info = _strategy_info(packed, bad=False, seed=step)
        ours._good = torch.tensor(1.0)
        ours._update_state(params, state, info, packed=packed)
        ours._good = None
        GsplatDefaultStrategy._update_state(ours, params, ref, info, packed=packed)
        for k in ("grad2d", "count", "radii"):
            assert torch.equal(state[k], ref[k]), (step, k)
    kept = {k: state[k].clone() for k in ("grad2d", "count", "radii")}
    ours._good = torch.tensor(0.0)
    ours._update_state(params, state, _strategy_info(packed, bad=True, seed=9), packed=packed)
    for k, v in kept.items():
        assert torch.equal(state[k], v), k  # a bad step adds nothing, NaN gradients included
    assert kept["count"].sum() > 0 and kept["radii"].max() > 0


def test_default_strategy_step_takes_the_flag_and_refines_on_a_bad_step():
    """Through step_post_backward: a bad refine step adds nothing to the statistics, then
    grows and prunes from the good steps' statistics (and resets them), as a good one would."""
    from distsplat.train.model.gaussians import create_optimizers, init_gaussians
    from distsplat.train.model.strategies import DefaultStrategy

    params = init_gaussians(torch.randn(20, 3, generator=torch.Generator().manual_seed(0)), torch.rand(20, 3), 1, (0, 20))
    opts = create_optimizers(params, global_batch=1)
    s = DefaultStrategy(refine_start_iter=1, refine_every=2, reset_every=1000, grow_grad2d=1e-9, prune_opa=0.0)
    state = s.initialize_state()
    s.step_post_backward(params, opts, state, 1, _strategy_info(True, bad=False), packed=True, good=torch.tensor(1.0))
    grown_by_good_steps = int((state["count"] > 0).sum())
    s.step_post_backward(params, opts, state, 2, _strategy_info(True, bad=True, seed=5), packed=True,
                         good=torch.tensor(0.0))
    assert len(params["means"]) == 20 + grown_by_good_steps  # duplicated (all small): the visible ones
    assert float(state["count"].sum()) == 0 and s._good is None


def test_mcmc_noise_is_not_injected_on_a_bad_step():
    from distsplat.train.model import strategy_ops
    from distsplat.train.model.gaussians import create_optimizers, init_gaussians
    from distsplat.train.model.strategies import MCMCStrategy
    from gsplat.strategy import MCMCStrategy as GsplatMCMCStrategy

    strategy_ops.install()  # gsplat's noise on CPU
    params = init_gaussians(torch.randn(30, 3, generator=torch.Generator().manual_seed(0)), torch.rand(30, 3), 1, (0, 30),
                            init_opacity=0.1)
    opts = create_optimizers(params, global_batch=1)
    s = MCMCStrategy(refine_start_iter=10_000)
    state = s.initialize_state()
    means = params["means"].detach().clone()
    s.step_post_backward(params, opts, state, 3, {}, lr=0.01, good=torch.tensor(0.0))
    assert torch.equal(params["means"], means)
    torch.manual_seed(7)
    s.step_post_backward(params, opts, state, 4, {}, lr=0.01, good=torch.tensor(1.0))
    moved = params["means"].detach().clone()
    assert not torch.equal(moved, means)
    with torch.no_grad():
        params["means"].copy_(means)
    torch.manual_seed(7)
    GsplatMCMCStrategy.step_post_backward(s, params, opts, state, 4, {}, lr=0.01)
    assert torch.equal(params["means"], moved)  # a good step's noise is gsplat's to the bit


def test_a_training_step_reads_no_flag_on_the_host(tmp_path, monkeypatch):
    """The divergence check stays on the device in the step: no tolist/item/bool/float of a
    tensor from faults.py (or from the post-backward Adam and statistics code) during
    train_step, on a good step and on a NaN step; the loop reads the flags afterwards."""
    import inspect

    from distsplat.train.config import Config, SyntheticConfig
    from distsplat.train.model.strategies import DefaultStrategy
    from distsplat.train.trainer import Trainer

    cfg = Config(result_dir=str(tmp_path), max_steps=4, eval_steps=[], save_steps=[], save_ply=False, sh_degree=1,
                 num_workers=1, prefetch=1, log_every=100, seed=3, max_bad_steps=3,
                 strategy=DefaultStrategy(refine_start_iter=10_000, refine_stop_iter=10_000, reset_every=10_000),
                 synthetic=SyntheticConfig(kind="ball", num_cameras=12, num_gaussians=400, width=32, height=24, seed=1))
    cfg.validate()
    trainer = Trainer(cfg, CTX)
    reads = []
    watched = {"faults.py"}

    def spy(name):
        real = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            stack = inspect.stack(context=0)
            try:
                sites = [(Path(f.filename).name, f.function) for f in stack[1:]]
            finally:
                del stack
            if any(file in watched or fn in ("adam_step", "_update_state", "_densify") for file, fn in sites):
                reads.append((name, sites[:4]))
            return real(self, *args, **kwargs)

        return read

    try:
        trainer.setup()
        trainer._open_outputs()
        with monkeypatch.context() as m:
            for name in ("tolist", "item", "__bool__", "__float__", "__int__", "__index__"):
                m.setattr(torch.Tensor, name, spy(name))
            trainer.train_step(0)
            steps = {k: int(o.state[trainer.params[k]]["step"]) for k, o in trainer.optimizers.items()}
            before = {k: v.detach().clone() for k, v in trainer.params.items()}
            hook = trainer.params["means"].register_hook(lambda g: torch.full_like(g, float("nan")))
            loss = trainer.train_step(1)
            hook.remove()
        assert reads == [], reads
        assert float(trainer.divergence.found) == 1.0 and torch.isfinite(loss)
        for k, v in trainer.params.items():
            assert torch.equal(v, before[k]), k  # skipped on the device
            assert int(trainer.optimizers[k].state[v]["step"]) == steps[k] == 1
        assert trainer.divergence.in_a_row == 0  # not read yet: the loop reads it after the step
        assert not trainer.divergence.poll(2, flush=False) and trainer.divergence.in_a_row == 1
    finally:
        trainer.cleanup()


def test_save_guard_skips_a_disk_full_write_and_says_where_and_how_much(tmp_path, caplog):
    guard = SaveGuard(CTX, torch.device("cpu"), tmp_path / "ckpts")

    def full():
        raise OSError(errno.ENOSPC, "No space left on device", "x")

    with caplog.at_level(logging.WARNING, logger="distsplat.train.guards.faults"):
        assert not guard.run("checkpoint of step 3", lambda r: tmp_path / f"f{r}", 12345, full)
    assert "checkpoint of step 3 not saved: rank 0 could not write " + str(tmp_path / "f0") in caplog.text
    assert "(12345 bytes)" in caplog.text and "no checkpoint is complete yet" in caplog.text
    assert guard.run("checkpoint of step 3", lambda r: tmp_path, 0, lambda: None)
    assert guard.failed == ["checkpoint of step 3"]
    metrics = {}
    guard.report_end(metrics)
    assert metrics["failed_saves"] == ["checkpoint of step 3"]


def test_save_guard_lets_other_errors_through(tmp_path):
    guard = SaveGuard(CTX, torch.device("cpu"), tmp_path)

    def denied():
        raise PermissionError(errno.EACCES, "Permission denied", "x")

    with pytest.raises(PermissionError):
        guard.run("PLY of step 1", lambda r: tmp_path, 0, denied)
    assert is_disk_full(OSError(errno.EDQUOT, "quota")) and is_disk_full(OSError(errno.EROFS, "ro"))
    assert not is_disk_full(OSError(errno.EIO, "io")) and not is_disk_full(ValueError())


def test_payload_bytes_counts_every_tensor():
    payload = {"params": {"a": torch.zeros(10, 3)}, "optim": {"a": {"step": torch.tensor(1.0), "lr": 0.1}},
               "rng": [torch.zeros(5, dtype=torch.uint8)]}
    assert payload_bytes(payload) == 10 * 3 * 4 + 4 + 5


def test_initial_gaussians_past_the_whole_memory_limit_end_setup():
    """A GPU too small for the initial Gaussians: ValueError before training (the limit flag
    stands in for the device's memory); one that fits does not raise."""
    from distsplat.train.model.gaussians import create_optimizers, init_gaussians
    from distsplat.train.guards.memory import MemoryGuard, bytes_per_gaussian

    params = init_gaussians(torch.randn(1000, 3), torch.rand(1000, 3), 1, (0, 1000))
    optimizers = create_optimizers(params, global_batch=1)
    b, _ = bytes_per_gaussian(dict(params), 2)
    small = MemoryGuard(1000 * b - 1, 0.9, rank=3, accumulators=2, measure=lambda: 0, limit_source="--memory_limit_gb x")
    with pytest.raises(ValueError, match=r"rank 3's 1000 initial Gaussians need .* more than its .* \(--memory_limit_gb x\)"):
        small.check_setup(params, optimizers, {})
    enough = MemoryGuard(1000 * b + 1, 0.9, rank=3, accumulators=2, measure=lambda: 0)
    enough.check_setup(params, optimizers, {})  # fits: no error (at most the growth warning)
