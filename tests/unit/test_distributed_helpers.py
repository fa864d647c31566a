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
from distsplat.distributed.render import _destinations, _GatherRows, _local_camera_ids, _pack, _ScatterRows, _unpack
from distsplat.render import Pairs, check_inputs


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


def test_local_camera_ids_index_each_owners_cameras_in_batch_order():
    owner = torch.tensor([2, 0, 2, 1, 0, 2])
    assert _local_camera_ids(owner, 3).tolist() == [0, 0, 1, 0, 1, 2]


def test_pack_unpack_round_trip_sorts_by_camera():
    M, D = 6, 4
    g = torch.Generator().manual_seed(0)
    pairs = Pairs(
        camera_ids=torch.tensor([0, 0, 1, 3, 3, 3]), gaussian_ids=torch.arange(M),
        radii=torch.randint(1, 50, (M, 2), generator=g, dtype=torch.int32),
        means2d=torch.randn(M, 2, generator=g), depths=torch.rand(M, generator=g),
        conics=torch.randn(M, 3, generator=g), opacities=torch.rand(M, generator=g),
        colors=torch.rand(M, D, generator=g),
    )
    local = torch.tensor([1, 0, 7, 0])  # batch camera -> receiver's camera; reorders the pairs
    payload = _pack(pairs, local, torch.float32)
    assert payload.shape == (M, 10 + D)
    out, sink, dirs = _unpack(payload, D, torch.float32)
    assert sink is None and dirs is None
    order = torch.argsort(local[pairs.camera_ids], stable=True)
    assert torch.equal(out.camera_ids, local[pairs.camera_ids][order])
    assert torch.equal(out.radii, pairs.radii[order]) and out.radii.dtype == torch.int32
    for f in ("means2d", "depths", "conics", "opacities", "colors"):
        assert torch.equal(getattr(out, f), getattr(pairs, f)[order]), f
    assert (out.gaussian_ids == -1).all()


@pytest.mark.parametrize("W", [1, 2, 3, 5])
def test_destinations_equal_a_stable_sort_by_owner(W):
    """_destinations' per-camera arithmetic against the definition it replaces: counts are
    a histogram of the pairs' owners, positions invert a stable argsort by owner."""
    g = torch.Generator().manual_seed(W)
    C = 7
    owner = torch.randint(0, W, (C,), generator=g)
    per_cam = torch.tensor([3, 0, 5, 1, 0, 4, 2])  # cameras that see nothing included
    camera_ids = torch.repeat_interleave(torch.arange(C), per_cam)  # sorted by camera
    counts, position = _destinations(camera_ids, owner, W)
    dest = owner[camera_ids]
    assert torch.equal(counts, torch.bincount(dest, minlength=W))
    order = torch.argsort(dest, stable=True)  # the grouped payload's row j is pair order[j]
    assert torch.equal(position[order], torch.arange(len(camera_ids)))


def test_row_permutations_move_values_and_gradients_back():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    perm = torch.randperm(6, generator=g)
    w = torch.randn(6, 3, generator=g, dtype=torch.float64)
    scattered = _ScatterRows.apply(x, perm)
    assert torch.equal(scattered[perm], x.detach())
    (scattered * w).sum().backward()
    assert torch.equal(x.grad, w[perm])
    x.grad = None
    gathered = _GatherRows.apply(x, perm)
    assert torch.equal(gathered, x.detach()[perm])
    (gathered * w).sum().backward()
    want = torch.zeros_like(w)
    want[perm] = w
    assert torch.equal(x.grad, want)
    assert torch.autograd.gradcheck(lambda t: _ScatterRows.apply(t, perm), (x,))
    assert torch.autograd.gradcheck(lambda t: _GatherRows.apply(t, perm), (x,))


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
