"""Functions run on every rank by harness.run_workers(...): `fn(ctx, *args) -> result`.

They return plain CPU tensors and strings; the tests compare them with one-process
references computed in the parent, so nothing here decides whether a test passes.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List

import torch
import torch.distributed as dist

import distsplat.distributed.render as dist_render
from distsplat.distributed import DistContext, distributed_rasterize
from scenes import PARAM_NAMES, case_layout, dense_means2d_grad, weighted_loss


def _local_params(layout: Dict[str, Any], rank: int) -> List[torch.Tensor]:
    start, end = layout["bounds"][rank]
    return [layout["gaussians"][k][start:end].clone().requires_grad_() for k in PARAM_NAMES]


def _render(layout: Dict[str, Any], params: List[torch.Tensor], **overrides: Any):
    kwargs = dict(layout["render_kwargs"])
    kwargs.update(overrides)
    return distributed_rasterize(
        *params, layout["viewmats"], layout["Ks"], 32, 24, layout["owner"],
        sh_degree=layout["sh_degree"], packed=layout["packed"], backend="torch", **kwargs,
    )


# ------------------------------------------------------------------------ W-invariance


def render_owner_variants(ctx: DistContext, names: List[str], seed: int) -> Dict[str, Any]:
    """render_cases twice: with the owners passed as a device tensor would be (their values
    come to the host with the counts; on CPU forced by a test switch), and with rank-major
    owners (the trainer's: the pairs need no reordering)."""
    dist_render._owner_tensor_on_device = True
    try:
        device = render_cases(ctx, names, seed)
    finally:
        dist_render._owner_tensor_on_device = False
    return {"device": device, "rank_major": render_cases(ctx, names, seed, rank_major=True)}


def render_cases(ctx: DistContext, names: List[str], seed: int, rank_major: bool = False) -> Dict[str, Any]:
    """For each case: this rank's renders, the gradients of its Gaussians for the
    weighted loss over its own cameras, and its densification inputs (means2d.grad,
    radii) in global ids. rank_major: the case's owners sorted."""
    out = {}
    for name in names:
        layout = case_layout(name, ctx.world_size)
        if rank_major:
            layout["owner"] = layout["owner"].sort().values
        params = _local_params(layout, ctx.rank)
        colors, alphas, meta = _render(layout, params)
        own = (layout["owner"] == ctx.rank).nonzero()[:, 0]
        loss = weighted_loss(colors, alphas, own, seed)
        loss.backward()
        start, _ = layout["bounds"][ctx.rank]
        n_all, C = layout["gaussians"]["means"].shape[0], layout["viewmats"].shape[0]
        out[name] = {
            "own": own, "meta_own": meta["own_cameras"].clone(),
            "colors": colors.detach(), "alphas": alphas.detach(),
            "grads": [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params],
            "means2d_grad": dense_means2d_grad(meta, n_all, start, C),
            "visible_count": _visible_count(meta, n_all, start),
            "n_cameras": meta["n_cameras"], "comm": meta["comm"],
        }
    return out


def _visible_count(meta: Dict[str, Any], n_all: int, offset: int) -> torch.Tensor:
    """How many batch cameras see each Gaussian (what densification counts)."""
    if meta["packed"]:
        gids = meta["gaussian_ids"] + offset
    else:
        gids = (meta["radii"] > 0).all(-1).nonzero()[:, 1] + offset
    return torch.bincount(gids, minlength=n_all)


# ---------------------------------------------------------------- communication budget


class CallCounter:
    """Counts REAL calls: every torch.distributed collective and every explicit
    device->host read of a tensor while `counting` is on. The render stages (the
    one-process layer, which has its own syncs when rasterizing on CPU) are run with
    counting paused, so what is left is the distributed layer's own traffic."""

    COLLECTIVES = ("all_to_all_single", "all_to_all", "all_gather", "all_gather_object",
                   "all_gather_into_tensor", "all_reduce", "broadcast", "broadcast_object_list",
                   "reduce_scatter_tensor", "gather", "scatter", "send", "recv", "isend",
                   "irecv", "barrier", "reduce", "gather_object", "scatter_object_list")
    HOST_READS = ("tolist", "item", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")

    def __init__(self):
        self.counting = False
        self.calls: Dict[str, int] = {}
        self.a2a_bytes: List[Dict[str, int]] = []
        self._saved: List[Any] = []

    def _wrap(self, owner: Any, name: str, record) -> None:
        original = getattr(owner, name)
        counter = self

        def wrapper(*args, **kwargs):
            if counter.counting:
                counter.calls[name] = counter.calls.get(name, 0) + 1
                record(args, kwargs)
            return original(*args, **kwargs)

        self._saved.append((owner, name, original))
        setattr(owner, name, wrapper)

    def _record_a2a(self, args, kwargs) -> None:
        out, inp = args[0], args[1]
        self.a2a_bytes.append({"in_bytes": inp.numel() * inp.element_size(),
                               "out_bytes": out.numel() * out.element_size(),
                               "in_splits": kwargs.get("input_split_sizes"),
                               "out_splits": kwargs.get("output_split_sizes")})

    def __enter__(self):
        for name in self.COLLECTIVES:
            if hasattr(dist, name):
                self._wrap(dist, name, self._record_a2a if name == "all_to_all_single" else lambda a, k: None)
        for name in self.HOST_READS:
            self._wrap(torch.Tensor, name, lambda a, k: None)
        for stage in ("project", "rasterize_pairs"):
            self._wrap_paused(dist_render, stage)
        return self

    def _wrap_paused(self, owner: Any, name: str) -> None:
        original = getattr(owner, name)
        counter = self

        def paused(*args, **kwargs):
            was, counter.counting = counter.counting, False
            try:
                return original(*args, **kwargs)
            finally:
                counter.counting = was

        self._saved.append((owner, name, original))
        setattr(owner, name, paused)

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)

    @contextlib.contextmanager
    def count(self):
        self.calls, self.a2a_bytes, self.counting = {}, [], True
        try:
            yield self
        finally:
            self.counting = False


def budget(ctx: DistContext, name: str, seed: int) -> Dict[str, Any]:
    """Two calls: a user's (checks on, the case's owners, not rank-major) and the trainer's
    (check_finite and check_cameras off, rank-major owners as the batcher draws them). The
    owners are passed as a list: they are host values (the counter cannot tell a CPU tensor
    that lives on the host from one standing in for a device tensor)."""
    out: Dict[str, Any] = {}
    for mode in ("user", "trainer"):
        layout = case_layout(name, ctx.world_size)
        if mode == "trainer":
            layout["owner"] = layout["owner"].sort().values
        params = _local_params(layout, ctx.rank)
        own = (layout["owner"] == ctx.rank).nonzero()[:, 0]
        checks = {} if mode == "user" else {"check_finite": False, "check_cameras": False}
        owners = layout["owner"].tolist()
        with CallCounter() as counter:
            with counter.count():
                colors, alphas, meta = distributed_rasterize(
                    *params, layout["viewmats"], layout["Ks"], 32, 24, owners,
                    sh_degree=layout["sh_degree"], packed=layout["packed"], backend="torch",
                    **layout["render_kwargs"], **checks)
            forward = (dict(counter.calls), list(counter.a2a_bytes))
            loss = weighted_loss(colors, alphas, own, seed)
            with counter.count():
                loss.backward()
            backward = (dict(counter.calls), list(counter.a2a_bytes))
        start, end = layout["bounds"][ctx.rank]
        out[mode] = {"forward": forward, "backward": backward, "comm": meta["comm"],
                     "bounds": (start, end), "own": own, "owner": layout["owner"]}
    return out


# ------------------------------------------------------------------------- bad inputs


def bad_inputs(ctx: DistContext) -> Dict[str, Any]:
    """Each case corrupts the inputs of some ranks, calls on every rank and records what
    each rank raised. A last good call with backward shows the group is still in step."""
    W, me = ctx.world_size, ctx.rank
    victim = W - 1  # the one rank that goes wrong in the one-rank cases
    layout = case_layout("base", W)

    def call(corrupt=None, **overrides):
        params = _local_params(layout, me)
        args = {"viewmats": layout["viewmats"].clone(), "Ks": layout["Ks"].clone(),
                "owner": layout["owner"].clone()}
        names = list(PARAM_NAMES)
        values = dict(zip(names, params))
        grad = contextlib.nullcontext()
        if corrupt is not None:
            grad = corrupt(values, args) or grad
        with grad:
            return distributed_rasterize(
                *[values[n] for n in names], args["viewmats"], args["Ks"], 32, 24, args["owner"],
                backend="torch", **overrides,
            )

    def on(ranks, fn):  # the corruption, applied on `ranks` only
        return fn if me in ranks else None

    def set_(d, key, value):
        d[key] = value

    everyone, one = list(range(W)), [victim]
    cases = {
        "owner_out_of_range": on(everyone, lambda v, a: a["owner"].__setitem__(0, W)),
        "owner_negative_one_rank": on(one, lambda v, a: a["owner"].__setitem__(1, -1)),
        "owner_wrong_length_one_rank": on(one, lambda v, a: set_(a, "owner", a["owner"][:-1])),
        "owner_float": on(everyone, lambda v, a: set_(a, "owner", a["owner"].double())),
        "owner_differs_one_rank": on(one, lambda v, a: set_(a, "owner", a["owner"].roll(1))),
        "viewmats_differ_one_rank": on(one, lambda v, a: a["viewmats"].__setitem__(
            (0, 0, 3), torch.nextafter(a["viewmats"][0, 0, 3], torch.tensor(10.0, dtype=torch.float64)))),
        "Ks_dtype_one_rank": on(one, lambda v, a: set_(a, "Ks", a["Ks"].float())),
        "quats_device_one_rank": on(one, lambda v, a: set_(v, "quats", v["quats"].to("meta"))),
        "nan_means_one_rank": on(one, lambda v, a: v["means"].data.__setitem__((3, 0), float("nan"))),
        "no_grad_one_rank": on(one, lambda v, a: torch.no_grad()),
    }
    results: Dict[str, Any] = {}
    for case, corrupt in cases.items():
        try:
            call(corrupt)
            results[case] = {"raised": None}
        except Exception as e:  # noqa: BLE001 - the test inspects what was raised
            results[case] = {"raised": type(e).__name__, "message": str(e),
                             "cause": repr(e.__cause__) if e.__cause__ is not None else None}

    # A projection that crashes on one rank: RuntimeError everywhere, not a hang.
    original = dist_render.project
    if me == victim:
        def broken(*a, **k):
            raise RuntimeError("simulated CUDA failure")
        dist_render.project = broken
    try:
        call()
        results["project_crash_one_rank"] = {"raised": None}
    except Exception as e:  # noqa: BLE001
        results["project_crash_one_rank"] = {
            "raised": type(e).__name__, "message": str(e),
            "cause": repr(e.__cause__) if e.__cause__ is not None else None}
    finally:
        dist_render.project = original

    colors, alphas, meta = call()
    (colors.sum() + alphas.sum()).backward()
    results["after"] = {"ok": True, "pairs": meta["comm"]["pairs_projected"]}
    return results


# --------------------------------------------------------------------------- training


def train(ctx: DistContext, steps: int, batch_size: int, lr: float, backend: str = "torch",
          dtype: str = "float64") -> Dict[str, torch.Tensor]:
    """`steps` Adam steps on this rank's chunk; each step's global batch and the loss (a
    mean over the global batch) come from scenes.training_setup. On ctx.device (the shared
    GPU in tests/cuda)."""
    from scenes import train_loop
    return train_loop(ctx.rank, ctx.world_size, steps, batch_size, lr, backend=backend,
                      device=str(ctx.device), dtype=getattr(torch, dtype))


# ------------------------------------------------------------------ harness self-test


def fail_or_hang(ctx: DistContext, mode: str) -> int:
    """Rank 1 raises or sleeps; rank 0 waits in a barrier for it."""
    if ctx.rank == 1:
        if mode == "raise":
            raise RuntimeError("boom on purpose")
        import time
        time.sleep(120)
    dist.barrier()
    return ctx.rank


# ------------------------------------------------- receiver-side colours (pair_colors)


def pair_color_cases(ctx: DistContext, names: List[str], seed: int) -> Dict[str, Any]:
    """render_cases with per-Gaussian features and a colour model the rendering rank
    evaluates on the pairs it receives (distributed_rasterize's pair_colors)."""
    from scenes import pair_color_setup

    out = {}
    for name in names:
        layout, colour_model = pair_color_setup(name, ctx.world_size, seed)
        params = _local_params(layout, ctx.rank)
        kwargs = dict(layout["render_kwargs"])
        colors, alphas, meta = distributed_rasterize(
            *params, layout["viewmats"], layout["Ks"], 32, 24, layout["owner"], sh_degree=None,
            packed=layout["packed"], backend="torch", pair_colors=colour_model, **kwargs)
        own = (layout["owner"] == ctx.rank).nonzero()[:, 0]
        weighted_loss(colors, alphas, own, seed).backward()
        out[name] = {"own": own, "colors": colors.detach(), "alphas": alphas.detach(),
                     "grads": [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params],
                     "comm": meta["comm"]}
    return out


# ------------------------------------------------------------- cameras agreed once per run


def agree_cameras_case(ctx: DistContext, differ_on: int) -> Dict[str, Any]:
    """The trainer's once-per-run camera agreement (train/scene_setup.agree_cameras) with the
    last rank's poses one ulp off when `differ_on` says so (-1: nobody differs)."""
    import types

    import numpy as np

    from distsplat.train.scene_setup import agree_cameras

    poses = np.tile(np.eye(4)[None], (3, 1, 1))
    if ctx.rank == differ_on:
        poses[1, 0, 3] = np.nextafter(0.0, 1.0)
    scene = types.SimpleNamespace(camtoworlds=poses, Ks=np.ones((3, 3, 3)), widths=np.full(3, 8),
                                  heights=np.full(3, 6))
    try:
        agree_cameras(scene, np.arange(3), {"num_cameras": 3, "world_size": ctx.world_size, "seed": 0}, ctx.device)
        return {"raised": None}
    except ValueError as e:
        return {"raised": str(e), "agreed": getattr(e, "agreed", False)}
