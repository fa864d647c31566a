"""Checkpoints: written by W ranks, read back by W' ranks with the same rows, Adam state
and continuation; partial and corrupt checkpoints are never used."""

import pytest
import torch

from distsplat.train import checkpoint as ck
from distsplat.train.gaussians import create_optimizers, init_gaussians, random_points


def bounds(n, w):
    q, r = divmod(n, w)
    out, s = [], 0
    for i in range(w):
        e = s + q + (i < r)
        out.append((s, e))
        s = e
    return out


def model(b, n=23):
    pts, rgb = random_points(n, 1.0, seed=1)
    params = init_gaussians(pts, rgb, sh_degree=1, bounds=b, seed=2)
    return params, create_optimizers(params, global_batch=2)


def adam_steps(params, optimizers, k, start_row=0):
    for i in range(k):
        loss = sum((p * (torch.arange(p.numel()).reshape(p.shape) + start_row * p[0].numel() + i).sin()).sum() for p in params.values())
        for o in optimizers.values():
            o.zero_grad()
        loss.backward()
        for o in optimizers.values():
            o.step()


def save(root, step, parts):
    ck.begin(root, step)
    for r, (params, opts, extra) in enumerate(parts):
        ck.write_shard(root, step, r, ck.shard_payload(params, opts, extra))
    return ck.finalize(root, step, [len(p["means"]) for p, _, _ in parts], {"config": {"a": 1}})


@pytest.mark.parametrize("w_new", [1, 3, 4])
def test_w2_checkpoint_resumes_on_other_world_sizes(tmp_path, w_new):
    n = 23
    # One model trained 3 steps, then cut into 2 "ranks" with their Adam state.
    params, opts = model((0, n))
    adam_steps(params, opts, 3)
    parts = []
    for b in bounds(n, 2):
        p, o = model(b)
        rows = {"params": {k: v.detach()[b[0]:b[1]] for k, v in params.items()},
                "optim": {k: {s: (t[b[0]:b[1]] if t.dim() else t) for s, t in opts[k].state[params[k]].items()} for k in params},
                "per_gaussian": {}}
        ck.load_rows_into(rows, p, o)
        parts.append((p, o, {"grad2d": torch.arange(b[0], b[1]).float()}))
    final = save(tmp_path, 3, parts)
    assert final.name == "step_000003" and not (tmp_path / "step_000003.tmp").exists()

    meta = ck.read_meta(tmp_path)  # the ckpts/ root finds the newest complete one
    assert meta["num_gaussians"] == n and meta["world_size"] == 2
    assert meta["state"] == {"config": {"a": 1}}
    resumed = []
    for b in bounds(n, w_new):
        rows = ck.read_rows(meta, *b)
        p, o = model(b)
        extra = ck.load_rows_into(rows, p, o)
        torch.testing.assert_close(extra["grad2d"], torch.arange(b[0], b[1]).float())
        resumed.append((p, o, b))
    for k in params:
        torch.testing.assert_close(torch.cat([p[k] for p, _, _ in resumed]), params[k], rtol=0, atol=0)
    # Two more Adam steps on the resumed chunks equal two more on the original model.
    adam_steps(params, opts, 2)
    for p, o, b in resumed:
        adam_steps(p, o, 2, start_row=b[0])
    for k in params:
        torch.testing.assert_close(torch.cat([p[k] for p, _, _ in resumed]), params[k])


def test_partial_and_corrupt_checkpoints_are_not_used(tmp_path):
    parts = [(*model(b), {}) for b in bounds(23, 2)]
    save(tmp_path, 10, parts)
    # A kill during step 20's write leaves only a .tmp: the newest complete one is step 10.
    ck.begin(tmp_path, 20)
    ck.write_shard(tmp_path, 20, 0, ck.shard_payload(parts[0][0], parts[0][1]))
    assert ck.read_meta(tmp_path)["step"] == 10
    # Save again later: the stale .tmp is replaced, older checkpoints pruned to `keep`.
    save(tmp_path, 20, parts)
    save(tmp_path, 30, parts)
    assert [p.name for p in ck.complete_checkpoints(tmp_path)] == ["step_000020", "step_000030"]
    # A truncated shard is refused with a message naming it.
    meta = ck.read_meta(tmp_path)
    shard = tmp_path / "step_000030" / "rank_0001.pt"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ck.CheckpointError, match=r"rank_0001.pt does not match its checksum"):
        ck.read_rows(meta, 0, 23)
    ck.read_rows(meta, 0, 5)  # rows only in the intact shard still load
    with pytest.raises(ck.CheckpointError, match="no complete checkpoint"):
        ck.read_meta(tmp_path / "nothing")
