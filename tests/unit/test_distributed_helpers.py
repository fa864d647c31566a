"""The distributed layer without a process group: the one-process context and its
no-op helpers, the status codes, the camera checksum and the payload packing."""

import pytest
import torch

from distsplat.distributed import (
    all_reduce_max,
    all_reduce_sum,
    barrier,
    distributed_rasterize,
    init_distributed,
    rank,
    world_size,
)
from distsplat.distributed import exchange as ex
import distsplat.distributed.render as render_mod
from distsplat.render import Pairs, check_inputs
from distsplat.render.gather import gather_rows


def test_one_process_context_without_torchrun(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    ctx = init_distributed()
    assert (ctx.rank, ctx.world_size, ctx.backend, ctx.is_main, ctx.distributed) == (0, 1, None, True, False)
    x = torch.arange(3.0)
    assert all_reduce_sum(x) is x and all_reduce_max(x) is x
    assert world_size() == 1 and rank() == 0
    barrier()


def test_context_rejects_inconsistent_layout():
    from distsplat.distributed import DistContext
    with pytest.raises(ValueError, match="rank 2"):
        DistContext(rank=2, world_size=2, local_rank=0, device=torch.device("cpu"), backend=None)


def test_argument_index_names_the_argument_of_each_render_check():
    """Every ValueError check_inputs raises maps to the argument it is about."""
    def args(**over):
        a = dict(means=torch.zeros(2, 3), quats=torch.zeros(2, 4), scales=torch.zeros(2, 3),
                 opacities=torch.zeros(2), colors=torch.zeros(2, 3), viewmats=torch.zeros(1, 4, 4),
                 Ks=torch.zeros(1, 3, 3), width=8, height=8)
        kw = dict(sh_degree=None, near_plane=0.01, far_plane=10.0, eps2d=0.3, backgrounds=None,
                  rasterize_mode="classic", render_mode="RGB", backend="torch")
        for k, v in over.items():
            (a if k in a else kw)[k] = v
        return a, kw

    cases = {"quats": dict(quats=torch.zeros(3, 4)), "Ks": dict(Ks=torch.zeros(1, 3, 3).double()),
             "width": dict(width=0), "render_mode": dict(render_mode="X"),
             "backend": dict(backend="cuda"), "near_plane": dict(near_plane=-1.0),
             "eps2d": dict(eps2d=-1.0), "sh_degree": dict(sh_degree=9),
             "backgrounds": dict(backgrounds=torch.zeros(2, 3))}
    for name, over in cases.items():
        a, kw = args(**over)
        with pytest.raises(ValueError) as e:
            check_inputs("distributed_rasterize", *a.values(), **kw)
        assert ex.ARGUMENTS[ex.argument_index(str(e.value))] == name, str(e.value)


def test_describe_status_is_one_sentence_per_kind():
    assert "invalid `Ks`" in ex.describe_status([1], ex.encode(ex.INVALID, ex.ARGUMENTS.index("Ks")), 2)
    msg = ex.describe_status([0, 2], ex.encode(ex.NONFINITE, 0b101), 3)
    assert msg.startswith("ranks 0, 2:") and "`means`, `scales`" in msg
    assert "[0, 4)" in ex.describe_status([3], ex.encode(ex.OWNER_RANGE), 4)


def test_camera_checksum_sees_one_ulp_and_reordering():
    v = torch.randn(3, 4, 4)
    K = torch.randn(3, 3, 3)
    owner = torch.tensor([0, 1, 1])
    h = ex.camera_checksum([v, K, owner], torch.device("cpu"))
    assert h == ex.camera_checksum([v.clone(), K.clone(), owner.clone()], torch.device("cpu"))
    v2 = v.clone()
    v2[1, 2, 3] = torch.nextafter(v2[1, 2, 3], torch.tensor(100.0))
    assert h != ex.camera_checksum([v2, K, owner], torch.device("cpu"))
    assert h != ex.camera_checksum([v[[1, 0, 2]], K[[1, 0, 2]], owner], torch.device("cpu"))
    assert h != ex.camera_checksum([v, K, torch.tensor([1, 0, 1])], torch.device("cpu"))
    assert h != ex.camera_checksum([v.double(), K, owner], torch.device("cpu"))


def _pairs(camera_ids, D=4, seed=0):
    M = len(camera_ids)
    g = torch.Generator().manual_seed(seed)
    return Pairs(
        camera_ids=torch.tensor(camera_ids), gaussian_ids=torch.arange(M),
        radii=torch.randint(-3, 50, (M, 2), generator=g, dtype=torch.int32),
        means2d=torch.randn(M, 2, generator=g), depths=torch.rand(M, generator=g),
        conics=torch.randn(M, 3, generator=g), opacities=torch.rand(M, generator=g),
        colors=torch.rand(M, D, generator=g),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("D,dirs,sink,depth_grad", [(4, 0, 0, False), (3, 0, 0, True), (5, 3, 2, False)])
def test_pack_unpack_round_trip_keeps_every_field_and_the_integer_bits(dtype, D, dirs, sink, depth_grad):
    """The payload is one cat in the pairs' order; integers ride as raw bits (negative radii,
    camera ids past float32's 2^24 too), padded to an 8-byte column; the receiver gets its
    own cameras' local ids from the layout."""
    pairs = _pairs([1, 1, 3, 3, 3, 3], D)  # batch positions of rank 0's cameras, as it receives them
    layout = render_mod._layout((1, 0, 1, 0), 2, 0, torch.device("cpu"))  # rank 0 owns cameras 1 and 3
    M = len(pairs)
    local = render_mod._Local(status=0, pairs=pairs, dirs=torch.randn(M, 3) if dirs else None,
                              sink=torch.zeros(M, 2) if sink else None)
    cols = render_mod._Columns(D=D, dirs=dirs, sink=sink, depth_grad=depth_grad, int_cols=8 // dtype.itemsize)
    payload = render_mod._pack(local, cols, dtype)
    assert payload.shape == (M, cols.total) and payload.dtype == dtype
    assert (cols.n_float + cols.pad) % cols.int_cols == 0
    head, tail = payload[:, :cols.n_grad], payload[:, cols.n_grad:]
    out, got_sink, got_dirs = render_mod._unpack(head, tail, cols, layout)
    assert out.camera_ids.tolist() == [0, 0, 1, 1, 1, 1]  # cameras 1 -> 0, 3 -> 1 of rank 0's
    assert torch.equal(out.radii, pairs.radii) and out.radii.dtype == torch.int32
    for f in ("means2d", "depths", "conics", "opacities", "colors"):
        assert torch.equal(getattr(out, f), getattr(pairs, f).to(dtype)), f
    assert (got_dirs is None) == (not dirs) and (got_sink is None) == (not sink)
    if dirs:
        assert torch.equal(got_dirs, local.dirs.to(dtype))
    assert (out.gaussian_ids == -1).all()
    big = torch.tensor([2**40 + 3, 2**24 + 1])  # raw bits, not float values
    assert torch.equal(render_mod._as_columns(big, dtype).view(torch.int64)[:, 0], big)


def test_layout_of_owners():
    lay = render_mod._layout((2, 0, 2, 1, 0, 2), 3, 2, torch.device("cpu"))
    assert lay.own == (0, 2, 5) and lay.own_idx.tolist() == [0, 2, 5] and not lay.rank_major
    assert lay.local_of.tolist() == [0, 0, 1, 0, 1, 2]
    assert lay.by_rank == ((1, 4), (3,), (0, 2, 5))
    major = render_mod._layout((0, 0, 1, 2, 2), 3, 1, torch.device("cpu"))
    assert major.rank_major and major.bounds.tolist() == [0, 2, 3, 5] and major.own == (2,)


@pytest.mark.parametrize("W", [1, 2, 3, 5])
def test_block_spans_group_the_pairs_by_owner_and_back(W):
    """The camera blocks in destination order equal a stable sort of the pairs by owner,
    and the backward puts every gradient row back where its pair was."""
    g = torch.Generator().manual_seed(W)
    C = 7
    owner = tuple(torch.randint(0, W, (C,), generator=g).tolist())
    per_cam = torch.tensor([3, 0, 5, 1, 0, 4, 2])  # cameras that see nothing included
    camera_ids = torch.repeat_interleave(torch.arange(C), per_cam)  # sorted by camera
    starts = [0] + torch.cumsum(per_cam, 0).tolist()
    spans, back = render_mod._block_spans(starts, render_mod._layout(owner, W, 0, torch.device("cpu")))
    x = torch.randn(len(camera_ids), 3, dtype=torch.float64, requires_grad=True)
    out = render_mod._Blocks.apply(x, spans, back)
    order = torch.argsort(torch.tensor(owner)[camera_ids], stable=True)
    assert torch.equal(out, x.detach()[order])
    w = torch.randn_like(out)
    (out * w).sum().backward()
    want = torch.zeros_like(w)
    want[order] = w
    assert torch.equal(x.grad, want)
    assert torch.autograd.gradcheck(lambda t: render_mod._Blocks.apply(t, spans, back), (x,))


def test_gather_rows_backward_is_the_indexing_gradient():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    idx = torch.tensor([4, 0, 4, 2, 4, 1])
    w = torch.randn(6, 3, dtype=torch.float64, generator=g)
    (gather_rows(x, idx) * w).sum().backward()
    got = x.grad.clone()
    x.grad = None
    (x[idx] * w).sum().backward()
    assert torch.equal(got, x.grad)
    assert torch.autograd.gradcheck(lambda t: gather_rows(t, idx), (x,))


def test_one_process_call_has_no_collective_and_rejects_bad_owner():
    means = torch.randn(5, 3) + torch.tensor([0, 0, 4.0])
    args = (means, torch.randn(5, 4), torch.rand(5, 3) * 0.1, torch.rand(5), torch.rand(5, 3),
            torch.eye(4)[None], torch.tensor([[[10.0, 0, 8], [0, 10, 8], [0, 0, 1]]]), 16, 16)
    colors, alphas, meta = distributed_rasterize(*args, torch.zeros(1, dtype=torch.long))
    assert colors.shape == (1, 16, 16, 3) and meta["comm"]["collectives"] == 0
    with pytest.raises(ValueError, match=r"rank 0: `camera_owner` holds ranks outside \[0, 1\)"):
        distributed_rasterize(*args, torch.ones(1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"unknown keyword arguments \['bg'\]"):
        distributed_rasterize(*args, torch.zeros(1, dtype=torch.long), bg=None)
