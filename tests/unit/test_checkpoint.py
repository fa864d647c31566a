"""Checkpoints: written by W ranks, read back by W' ranks with the same rows, Adam state
and continuation; partial and corrupt checkpoints are never used."""

import os
from pathlib import Path

import pytest
import torch

from distsplat.train.files import checkpoint as ck
from distsplat.train.model.gaussians import create_optimizers, init_gaussians, random_points


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


# ---------------------------------------------------------------- damaged checkpoints
# Each is refused with a message naming the file and what to do instead: resume from the
# earlier checkpoint, or (with none) start without --ckpt. Never a silent fall-back.

def two_saved(root):
    parts = [(*model(b), {}) for b in bounds(23, 2)]
    save(root, 10, parts)
    save(root, 20, parts)
    return root / "step_000020"


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


EARLIER = "resume from the earlier checkpoint --ckpt {root}/step_000010 or start without --ckpt"


@pytest.mark.parametrize("damage, file, message", [
    (truncate, "rank_0001.pt", "rank_0001.pt does not match its checksum in {d}/meta.json: the file is corrupt or truncated"),
    (flip_byte, "rank_0000.pt", "rank_0000.pt does not match its checksum in {d}/meta.json: the file is corrupt or truncated"),
    (lambda p: p.unlink(), "rank_0001.pt", "rank_0001.pt is missing: the checkpoint at {d} is incomplete"),
], ids=["truncated_shard", "flipped_byte_in_shard", "missing_shard"])
def test_damaged_shard_is_refused(tmp_path, damage, file, message):
    d = two_saved(tmp_path)
    damage(d / file)
    meta = ck.read_meta(tmp_path)  # the newest, not silently the older one
    assert meta["dir"] == str(d)
    with pytest.raises(ck.CheckpointError) as e:
        ck.read_rows(meta, 0, 23)
    assert str(e.value) == f"{d}/{message.format(d=d)}; {EARLIER.format(root=tmp_path)}"
    # Every rank can raise that same error, also those that do not read the bad shard.
    problems = ck.check_shards(meta, range(2))
    assert list(problems) == [int(file[5:9])]
    i = int(file[5:9])
    assert str(ck.shard_error(meta, i, problems[i])) == str(e.value)


@pytest.mark.parametrize("damage, message", [
    (truncate, "is truncated or corrupt (not valid JSON)"),
    (lambda p: p.write_text(p.read_text().replace('"end": 12', '"end": 13', 1)),
     "does not match its own checksum (meta_sha256): the file is corrupt"),
    (lambda p: p.write_text(p.read_text().replace('"step": 20', '"step": 21', 1)),
     "does not match its own checksum (meta_sha256): the file is corrupt"),
], ids=["truncated_meta", "meta_edited_rows", "meta_edited_step"])
def test_damaged_meta_is_refused_on_every_path_to_it(tmp_path, damage, message):
    d = two_saved(tmp_path)
    damage(d / "meta.json")
    for path in (tmp_path, d):  # the ckpts/ root does not fall back to step 10 in silence
        with pytest.raises(ck.CheckpointError) as e:
            ck.read_meta(path)
        assert str(e.value) == f"{d}/meta.json {message}; {EARLIER.format(root=tmp_path)}"


def test_missing_meta_is_refused_naming_it(tmp_path):
    d = two_saved(tmp_path)
    (d / "meta.json").unlink()
    with pytest.raises(ck.CheckpointError) as e:
        ck.read_meta(d)
    assert str(e.value) == (f"{d}/meta.json is missing: the checkpoint at {d} is incomplete (killed while "
                            f"it was written?); {EARLIER.format(root=tmp_path)}")
    assert ck.read_meta(tmp_path)["step"] == 10  # without meta.json step 20 was never complete
    (tmp_path / "step_000010" / "rank_0000.pt").unlink()
    with pytest.raises(ck.CheckpointError, match=r"step_000010/rank_0000.pt is missing: .*; start without --ckpt"):
        ck.read_rows(ck.read_meta(tmp_path), 0, 23)


def test_format_1_checkpoints_still_load_and_newer_formats_say_so(tmp_path):
    import json

    d = two_saved(tmp_path)
    meta = json.loads((d / "meta.json").read_text())
    del meta["meta_sha256"]
    meta["format"] = 1  # as distsplat wrote them before meta_sha256
    (d / "meta.json").write_text(json.dumps(meta))
    assert ck.read_meta(d)["num_gaussians"] == 23
    ck.read_rows(ck.read_meta(d), 0, 23)
    meta["format"] = 3
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ck.CheckpointError, match=r"meta.json has checkpoint format 3, newer than this "
                                                  r"distsplat reads \(1, 2\): upgrade distsplat"):
        ck.read_meta(d)


def test_pruning_keeps_newer_checkpoints_and_begin_clears_earlier_kills(tmp_path):
    parts = [(*model(b), {}) for b in bounds(23, 2)]
    for step in (10, 50):  # 50: another run's, further along, in the same directory
        save(tmp_path, step, parts)
    # What kills leave: a .tmp, a half-deleted .pruned (meta.json without shards), and a
    # step saved again whose old version was set aside but whose new one never arrived.
    (tmp_path / "step_000040.tmp").mkdir()
    (tmp_path / "step_000005.pruned").mkdir()
    (tmp_path / "step_000005.pruned" / "meta.json").write_text("{}")
    os.replace(tmp_path / "step_000050", tmp_path / "step_000050.replaced")
    (tmp_path / "step_000060.old").mkdir()  # not ours: names are exact
    assert [p.name for p in ck.complete_checkpoints(tmp_path)] == ["step_000010", "step_000050.replaced"]
    save(tmp_path, 20, parts)
    save(tmp_path, 30, parts)  # keep=2 among steps <= 30: 10 goes, 50 stays
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["step_000020", "step_000030", "step_000050", "step_000060.old"]
    assert ck.newer_checkpoints(tmp_path, 30) == [tmp_path / "step_000050"]
    save(tmp_path, 30, parts)  # the same step again: replaced, nothing else moves
    assert [p.name for p in ck.complete_checkpoints(tmp_path)] == ["step_000020", "step_000030", "step_000050"]
    assert ck.read_meta(tmp_path)["step"] == 50


def test_steps_past_a_million_sort_by_number(tmp_path):
    parts = [(*model(b), {}) for b in bounds(23, 1)]
    save(tmp_path, 999_999, parts)
    save(tmp_path, 1_000_000, parts)
    assert ck.read_meta(tmp_path)["step"] == 1_000_000


def test_fused_adam_resumes_exactly(tmp_path):
    """create_optimizers' fused Adam (the default on every device: its found_inf skips a
    diverged step on the device, faults.py) keeps its step counter beside the parameter: a
    checkpoint written and read back into fresh fused optimizers continues bit for bit like
    the uninterrupted run. The same run with torch's unfused Adam (fused=False) ends within
    rounding of it: the same update."""
    n = 23

    def fused_model():
        params, _ = model((0, n))
        return params, create_optimizers(params, global_batch=2)

    def unfused_model():
        params, _ = model((0, n))
        return params, create_optimizers(params, global_batch=2, fused=False)

    params, opts = fused_model()
    assert all(o.defaults["fused"] for o in opts.values())
    assert not any(o.defaults.get("fused") for o in unfused_model()[1].values())
    adam_steps(params, opts, 3)
    save(tmp_path, 3, [(params, opts, {})])
    p2, o2 = fused_model()
    ck.load_rows_into(ck.read_rows(ck.read_meta(tmp_path), 0, n), p2, o2)
    for k in params:
        assert o2[k].state[p2[k]]["step"].device == p2[k].device
    adam_steps(params, opts, 2)
    adam_steps(p2, o2, 2)
    for k in params:
        assert torch.equal(params[k], p2[k]), k
        assert torch.equal(opts[k].state[params[k]]["exp_avg_sq"], o2[k].state[p2[k]]["exp_avg_sq"]), k
    p3, o3 = unfused_model()
    adam_steps(p3, o3, 3)
    adam_steps(p3, o3, 2)
    for k in params:
        # 5 Adam steps of lr <= 0.05 * sqrt(2): the two kernels round differently, no more
        torch.testing.assert_close(p3[k], params[k], rtol=1e-5, atol=1e-6)


def write_empty(root: Path, step: int, interim: bool = False, keep: int = 0) -> None:
    ck.begin(root, step)
    d = ck.tmp_dir(root, step)
    (d / "rank_0000.sha256").write_text("0" * 64)
    ck.finalize(root, step, [0], {"config": {}}, keep=keep, interim=interim)


def test_interim_checkpoints_bridge_to_the_next_regular_one_and_never_push_one_out(tmp_path):
    root = tmp_path / "ckpts"
    for step, interim in [(10, False), (12, True), (14, True), (16, True), (20, False), (22, True), (30, False)]:
        write_empty(root, step, interim)
    done = ck.complete_checkpoints(root)
    keep = lambda upto, k: [ck._step_of(p) for p in done if ck._step_of(p) <= upto  # noqa: E731
                            and p not in ck.prunable([q for q in done if ck._step_of(q) <= upto], k)]
    assert keep(16, 2) == [10, 14, 16]  # the regular 10 stays; 2 interim newer than it
    assert keep(22, 2) == [10, 20, 22]  # 12-16 bridged to 20, pruned
    assert keep(30, 2) == [20, 30]  # as without interim checkpoints
    assert keep(30, 1) == [30] and keep(22, 1) == [20, 22]
    assert ck.is_interim(root / "step_000022") and not ck.is_interim(root / "step_000020")
    write_empty(root, 32, interim=True, keep=2)  # finalize prunes what prunable lists
    assert [ck._step_of(p) for p in ck.complete_checkpoints(root)] == [20, 30, 32]
    write_empty(root, 40, keep=2)
    assert [ck._step_of(p) for p in ck.complete_checkpoints(root)] == [30, 40]
