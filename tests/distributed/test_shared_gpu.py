"""Shared-GPU mode's staged collectives (distsplat/distributed/staging.py), walked on CPU
ranks with staging forced: with W = 2, 3 gloo ranks every render and gradient equals the
one-process `rasterize` (the references of test_render_invariance.py), the staged path
really runs (its host transfers are counted: 2 per forward, 1 per backward), and the
helpers built on it (all-reduce, broadcast, raise_together, move_rows) give the values a
one-process computation gives. Then init_distributed's layout checks, with CUDA faked
(no process group is created). The same worker runs on one real GPU in
tests/cuda/test_shared_gpu_cuda.py."""

import logging

import pytest
import torch
import torch.distributed as dist

from distsplat.distributed import chunk_bounds, context, distributed_rasterize, init_distributed, staging
from scenes import CASES, PARAM_NAMES, WIDTH, HEIGHT, case_layout
from test_render_invariance import SEED, TOL, reference


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"W{w}")
def world(request, run_workers):
    W = request.param
    return W, run_workers("staging_workers:staged_cases", W, list(CASES), SEED, "torch", "float64")


@pytest.mark.parametrize("name", list(CASES))
def test_staged_renders_and_gradients_equal_one_process(world, name):
    W, results = world
    ref = reference(name, W)
    for rank, res in enumerate(results):
        assert res["_context"] == {"device": "cpu", "backend": "gloo", "shared_gpu": False, "forced": True}
        own = res[name]["own"]
        torch.testing.assert_close(res[name]["colors"], ref["colors"][own], **TOL,
                                   msg=lambda m: f"rank {rank}, case {name}: {m}")
        torch.testing.assert_close(res[name]["alphas"], ref["alphas"][own], **TOL,
                                   msg=lambda m: f"rank {rank}, case {name}: {m}")
    for i, pname in enumerate(PARAM_NAMES):
        got = torch.cat([res[name]["grads"][i] for res in results])
        torch.testing.assert_close(got, ref["grads"][i], **TOL,
                                   msg=lambda m: f"case {name}, grad of {pname}: {m}")
    got = sum(res[name]["means2d_grad"] for res in results)
    torch.testing.assert_close(got, ref["means2d_grad"], **TOL)


@pytest.mark.parametrize("name", list(CASES))
def test_staged_path_is_taken_and_its_syncs_counted(world, name):
    """Forward: the count transfer + the staged payload; backward: the staged reverse
    payload. An unstaged run would count (1, 0)."""
    W, results = world
    for rank, res in enumerate(results):
        assert res[name]["syncs"] == (2, 1), f"rank {rank}"
        comm = res[name]["comm"]
        assert (comm["host_syncs"], comm["backward_host_syncs"]) == (2, 1), f"rank {rank}"
        assert (comm["collectives"], comm["backward_collectives"]) == (2, 1)


def test_staged_helpers(world):
    W, results = world
    v = [torch.arange(4, dtype=torch.float64) + 10.0 * r for r in range(W)]
    for rank, res in enumerate(results):
        h = res["_helpers"]
        assert torch.equal(h["sum"], sum(v))
        assert torch.equal(h["max"], v[-1])
        assert torch.equal(h["broadcast"], v[W - 1])
        assert torch.equal(h["v_after"], v[rank]), "all_reduce must not touch its input"
        assert h["raised"] == "rank 0: bad flag on rank 0"
        assert h["counts"] == [hi - lo for lo, hi in chunk_bounds(10, W)]
        expected = torch.arange(10, dtype=torch.float32)[:, None].repeat(1, 2) if rank == 0 else torch.zeros(0, 2)
        assert torch.equal(h["moved"], expected), f"rank {rank}"


def test_one_process_counts_one_sync_forward_none_backward():
    """W=1 (no process group): the count transfer is the only one, and it is counted."""
    layout = case_layout("base", 1)
    params = [layout["gaussians"][k].clone().requires_grad_() for k in PARAM_NAMES]
    s0 = staging.host_syncs()
    colors, alphas, meta = distributed_rasterize(
        *params, layout["viewmats"], layout["Ks"], WIDTH, HEIGHT, layout["owner"], backend="torch")
    s1 = staging.host_syncs()
    (colors.sum() + alphas.sum()).backward()
    assert (s1 - s0, staging.host_syncs() - s1) == (1, 0)
    assert (meta["comm"]["host_syncs"], meta["comm"]["backward_host_syncs"]) == (1, 0)
    assert torch.equal(meta["own_cameras"], torch.arange(len(layout["owner"])))


# ----------------------------------------------------------- init_distributed, CUDA faked


@pytest.fixture
def fake_node(monkeypatch):
    """A torchrun environment and a node with `gpus` fake GPUs; records what
    init_distributed asks of torch.cuda and torch.distributed (no group is created)."""
    calls = {"init": None, "set_device": None}
    monkeypatch.setattr(staging, "_shared_device", None)  # restored after the test
    monkeypatch.setattr(context, "_shared_gpu_warned", False)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.__setitem__("init", kw))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.__setitem__("set_device", d))
    monkeypatch.delenv(context.SHARED_GPU_ENV, raising=False)

    def node(rank, local_rank, local_world, world, gpus):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        for k, v in dict(RANK=rank, LOCAL_RANK=local_rank, LOCAL_WORLD_SIZE=local_world,
                         WORLD_SIZE=world, MASTER_ADDR="127.0.0.1", MASTER_PORT=1).items():
            monkeypatch.setenv(k, str(v))
        return calls
    return node


def test_more_ranks_than_gpus_under_nccl_is_refused_before_joining(fake_node):
    calls = fake_node(rank=0, local_rank=0, local_world=4, world=4, gpus=1)
    with pytest.raises(ValueError) as e:
        init_distributed()
    msg = str(e.value)
    assert "4 ranks on this node" in msg and "1 CUDA devices" in msg
    assert "--nproc_per_node=1" in msg and "DISTSPLAT_SHARED_GPU=1" in msg
    assert calls["init"] is None, "must fail before init_process_group"


@pytest.mark.parametrize("how", ["env", "argument"])
def test_shared_gpu_mode_puts_every_rank_on_one_gpu_over_gloo(fake_node, monkeypatch, caplog, how):
    calls = fake_node(rank=0, local_rank=0, local_world=4, world=4, gpus=1)
    if how == "env":
        monkeypatch.setenv(context.SHARED_GPU_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="distsplat"):
        ctx = init_distributed(shared_gpu=True if how == "argument" else None)
    assert (ctx.device, ctx.backend, ctx.shared_gpu) == (torch.device("cuda", 0), "gloo", True)
    assert calls["init"]["backend"] == "gloo" and calls["set_device"] == torch.device("cuda", 0)
    assert staging.shared_device() == torch.device("cuda", 0)
    warnings = [r.getMessage() for r in caplog.records if "correctness checks only" in r.getMessage()]
    assert len(warnings) == 1 and "never report its speed" in warnings[0]


def test_shared_gpu_mode_spreads_over_visible_gpus_and_logs_on_rank_0_only(fake_node, caplog):
    fake_node(rank=3, local_rank=3, local_world=4, world=4, gpus=2)
    with caplog.at_level(logging.WARNING, logger="distsplat"):
        ctx = init_distributed(shared_gpu=True)
    assert ctx.device == torch.device("cuda", 1)  # local_rank % device_count
    assert not [r for r in caplog.records if "correctness checks only" in r.getMessage()]


@pytest.mark.parametrize("gpus,kwargs,env,words", [
    (0, {}, "1", ["no CUDA device", "DISTSPLAT_SHARED_GPU"]),
    (1, {"backend": "nccl"}, "1", ["runs over gloo", "backend='nccl'"]),
    (1, {}, "yes", ["DISTSPLAT_SHARED_GPU must be 1", "'yes'"]),
    (0, {"backend": "nccl"}, "0", ["'nccl' needs CUDA devices", "'gloo'"]),
])
def test_shared_gpu_mode_bad_setups(fake_node, monkeypatch, gpus, kwargs, env, words):
    calls = fake_node(rank=0, local_rank=0, local_world=2, world=2, gpus=gpus)
    monkeypatch.setenv(context.SHARED_GPU_ENV, env)
    with pytest.raises(ValueError) as e:
        init_distributed(**kwargs)
    assert all(w in str(e.value) for w in words), str(e.value)
    assert calls["init"] is None
