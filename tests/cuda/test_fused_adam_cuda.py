"""create_optimizers' default on CUDA: torch's fused Adam (one kernel per parameter and
step). Its step counter lives on the device, which checkpoints (saved on the host) and
rebalancing hand back through checkpoint.load_rows_into; the strategies' row surgery keeps
it. Checked against the uninterrupted run (bit for bit) and against the foreach Adam that
was the default before (within rounding: the same update). Needs a GPU."""

import pytest
import torch

from distsplat.train.files import checkpoint as ck
from distsplat.train.model.gaussians import create_optimizers, init_gaussians, random_points
from distsplat.train.model.strategy_ops import duplicate_with_ids

pytestmark = pytest.mark.cuda
N = 31


def model(fused=None):
    pts, rgb = random_points(N, 1.0, seed=1)
    params = init_gaussians(pts, rgb, sh_degree=1, bounds=(0, N), seed=2, device="cuda")
    return params, create_optimizers(params, global_batch=2, fused=fused)


def adam_steps(params, optimizers, steps, first=0):
    for i in range(first, first + steps):
        loss = sum((p * (torch.arange(p.numel(), device=p.device).reshape(p.shape) + i).sin()).sum()
                   for p in params.values())
        for o in optimizers.values():
            o.zero_grad()
        loss.backward()
        for o in optimizers.values():
            o.step()


def test_fused_adam_is_the_cuda_default_and_resumes_exactly(tmp_path):
    params, opts = model()
    assert all(o.defaults["fused"] for o in opts.values())
    adam_steps(params, opts, 3)
    ck.begin(tmp_path, 3)
    ck.write_shard(tmp_path, 3, 0, ck.shard_payload(params, opts))
    ck.finalize(tmp_path, 3, [N], {"config": {}})
    p2, o2 = model()
    ck.load_rows_into(ck.read_rows(ck.read_meta(tmp_path), 0, N), p2, o2)
    for k in params:
        assert o2[k].state[p2[k]]["step"].device == p2[k].device  # the fused kernel reads it there
    adam_steps(params, opts, 2, first=3)
    adam_steps(p2, o2, 2, first=3)
    for k in params:
        assert torch.equal(params[k], p2[k]), k
    p3, o3 = model(fused=False)  # the foreach Adam
    adam_steps(p3, o3, 5)
    for k in params:
        # five steps of the same update, rounded by two kernels: a few float32 ulps of lr
        torch.testing.assert_close(p3[k], params[k], rtol=1e-5, atol=1e-6)


def test_fused_adam_steps_after_densification():
    params, opts = model()
    adam_steps(params, opts, 2)
    state = {"uid": torch.arange(N, device="cuda")}
    mask = torch.zeros(N, dtype=torch.bool, device="cuda")
    mask[::3] = True
    duplicate_with_ids(params, opts, state, mask, step=2)
    n = N + int(mask.sum())
    assert len(params["means"]) == n
    for k, p in params.items():
        st = opts[k].state[p]
        assert st["exp_avg"].shape[0] == n and st["step"].device == p.device
    before = {k: p.detach().clone() for k, p in params.items()}
    adam_steps(params, opts, 1, first=2)
    assert all(not torch.equal(before[k], params[k]) for k in params)
