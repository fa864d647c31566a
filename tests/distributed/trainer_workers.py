"""Workers for test_trainer.py: the Trainer on gloo CPU ranks, on a tiny built-in scene."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional

import torch
from distsplat.train.model.strategies import DefaultStrategy, MCMCStrategy

from distsplat.distributed import CameraBatch, CameraBatcher, chunk_bounds, distributed_rasterize, gather_counts
from distsplat.train.model.app_opt import colour_kwargs
from distsplat.train.config import Config, SyntheticConfig
from distsplat.train.model.gaussians import activated, create_optimizers
from distsplat.train.trainer import Trainer


def tiny_config(result_dir: str, **overrides: Any) -> Config:
    cfg = Config(
        result_dir=result_dir, max_steps=20, eval_steps=[], save_steps=[], save_ply=False,
        sh_degree=1, sh_degree_interval=10, init_type="sfm", num_workers=1, prefetch=1,
        log_every=10, batch_size=1, seed=3,
        strategy=DefaultStrategy(refine_start_iter=10_000, refine_stop_iter=0, reset_every=10_000),
        synthetic=SyntheticConfig(kind="ball", num_cameras=12, num_gaussians=400, width=32, height=24, seed=1),
    )
    for k, v in overrides.items():
        setattr(cfg, k, v)
    cfg.validate()
    return cfg


class ReplayBatcher:
    """The global batches that `shards` ranks of one camera each would draw
    (CameraBatcher(n, shards, 1, seed)), their cameras handed to this run's W ranks in
    contiguous groups of shards (chunk_bounds), with the images: W=1 and W=2 train on
    exactly W=3's batches. Everything else (epochs, state) is the replayed batcher's."""

    def __init__(self, real: CameraBatcher, shards: int):
        self.inner = CameraBatcher(real.num_cameras, shards, 1, real.seed)
        groups = chunk_bounds(shards, real.world_size)  # [W] the shards each rank replays
        self.slots = [list(range(a, b)) for a, b in groups]
        self.owner = torch.tensor([r for r, (a, b) in enumerate(groups) for _ in range(a, b)])  # [shards]

    def own_cameras(self, rank: int) -> torch.Tensor:
        return torch.cat([self.inner.own_cameras(s) for s in self.slots[rank]]).sort().values

    def batch(self, epoch: int, step: int) -> CameraBatch:
        b = self.inner.batch(epoch, step)
        return CameraBatch(b.cameras, self.owner.clone(), b.epoch, b.step)

    def own_batch(self, epoch: int, step: int, rank: int) -> List[int]:  # the image loader's schedule
        b = self.batch(epoch, step)
        return b.cameras[b.own(rank)].tolist()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class ReplayTrainer(Trainer):
    """A run of W ranks replaying the global batches that `shards` ranks would draw, so
    W=1 (or W=2) sees exactly the W=shards run's batches."""

    shards = 2

    @property
    def batcher(self):
        return self._replay

    @batcher.setter
    def batcher(self, real: CameraBatcher) -> None:  # setup() builds the real one
        self._replay = ReplayBatcher(real, self.shards)


def fixed_view_render(trainer: Trainer) -> Optional[torch.Tensor]:
    """Renders the first two test cameras (owned by rank 0) with the distributed render."""
    test = trainer.test_idx[:2]
    g = activated(trainer.params, trainer.cfg.sh_degree)
    with torch.no_grad():
        colors, _, _ = distributed_rasterize(
            g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
            trainer.scene.viewmats(test.numpy(), trainer.device).to(trainer.Ks.dtype), trainer.Ks[test],
            trainer.width, trainer.height, torch.zeros(len(test), dtype=torch.int64),
            **colour_kwargs(getattr(trainer, "app", None), trainer.cfg.sh_degree),  # SH, or --app_opt's MLP
        )
    return colors if trainer.ctx.rank == 0 else None


def _app(trainer: Trainer) -> Optional[Dict[str, torch.Tensor]]:
    """--app_opt's state on this rank: its embedding rows in the [n_train, D] table (NaN
    elsewhere) and the MLP's parameters flattened (issue 18)."""
    app = getattr(trainer, "app", None)
    if app is None:
        return None
    return {"embeds": app.table(), "mlp": torch.cat([p.detach().reshape(-1) for p in app.mlp.parameters()])}


def _bilagrid(trainer: Trainer) -> Optional[torch.Tensor]:
    """--use_bilateral_grid's grids on this rank: [n_train, 12, L, Y, X], NaN off its own images."""
    grids = getattr(trainer, "bilagrid", None)
    return None if grids is None else grids.table()


def _params(trainer: Trainer) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.params.items()}


def to_float64(trainer: Trainer, global_batch: int, anisotropic: float = 0.0) -> None:
    """Float64 parameters, optimizers (Adam scaled for `global_batch`), cameras and 2D
    gradient sums: Adam's tiny eps turns float32 rounding of near-zero gradients into
    lr-sized steps, so exact W-invariance is checked in float64.
    anisotropic: adds a seeded uniform(-a, a) to every log scale (the same draw for all
    Gaussians, this rank's rows kept). gsplat's initial scales are isotropic, which makes
    the quaternions' true gradient exactly zero: what backward returns is then rounding
    noise whose value depends on the CPU's vector kernels, and Adam (eps 7e-16) turns it
    into steps of up to lr; anisotropic scales give every quaternion a real gradient."""
    params = {k: v.detach().double() for k, v in trainer.params.items()}
    if anisotropic:
        start, end = chunk_bounds(trainer.n_all, trainer.ctx.world_size)[trainer.ctx.rank]
        g = torch.Generator().manual_seed(11)
        jitter = (torch.rand(trainer.n_all, 3, generator=g, dtype=torch.float64) * 2 - 1) * anisotropic
        params["scales"] = params["scales"] + jitter[start:end]
    # In place: the checkpoint's rows (trainer.rows) and the strategy hold these dicts
    trainer.params.update({k: torch.nn.Parameter(v) for k, v in params.items()})
    trainer.optimizers.update(create_optimizers(trainer.params, global_batch, trainer.scene_scale))
    trainer.means_lr0 = trainer.optimizers["means"].param_groups[0]["lr"]  # the schedule's start
    # the cameras' dtype: the poses follow it (Trainer.train_viewmats), in training and evaluation
    trainer.Ks = trainer.evaluator.Ks = trainer.Ks.double()
    if getattr(trainer, "pose", None) is not None:  # pose corrections (issue 18)
        trainer.pose.global_batch = global_batch  # the replayed batch, as the optimizers above
        trainer.pose.to(torch.float64)
    if getattr(trainer, "app", None) is not None:  # appearance optimization (issue 18)
        trainer.app.global_batch = global_batch
        trainer.app.to(torch.float64)
    if getattr(trainer, "bilagrid", None) is not None:  # bilateral grids (issue 46)
        trainer.bilagrid.global_batch = global_batch
        trainer.bilagrid.to(torch.float64)
    if "grad2d" in trainer.strategy_state:  # DefaultStrategy's gradient sum (gsplat's is float32)
        trainer.strategy_state["grad2d"] = torch.zeros(len(trainer.params["means"]), dtype=torch.float64)


def record_adam(trainer: Trainer) -> Dict[str, Any]:
    """Hooks every optimizer (the Gaussians', and --pose_opt's and --app_opt's) to record,
    per step, each component's gradient and Adam's denominator sqrt(v_hat) + eps: what a
    gradient perturbation of size d is divided by (test_trainer.py derives its per-component
    noise bound from them); with "uid" the Gaussians' ids at each step (their rows change at
    refine steps). An optimizer of several tensors (the MLP) records them flattened, one row."""
    rec: Dict[str, Any] = {"uid": []}
    optimizers = dict(trainer.optimizers)
    if getattr(trainer, "pose", None) is not None:
        optimizers["pose"] = trainer.pose.optimizer
    if getattr(trainer, "app", None) is not None:
        optimizers["app_embeds"], optimizers["app_mlp"] = trainer.app.embed_opt, trainer.app.mlp_opt
    if getattr(trainer, "bilagrid", None) is not None:
        optimizers["bilagrid"] = trainer.bilagrid.optimizer
    for name, opt in optimizers.items():
        r = rec[name] = {"grad": [], "denom": [], "lr": []}
        whole = name in trainer.optimizers  # one [N, ...] tensor per step, else flattened

        def pre(opt, args, kwargs, r=r, whole=whole, name=name):
            ps = opt.param_groups[0]["params"]
            g = [p.grad.detach() for p in ps]
            r["grad"].append(g[0].clone() if whole else torch.cat([x.reshape(-1) for x in g]))
            r["lr"].append(opt.param_groups[0]["lr"])
            if name == "means":
                rec["uid"].append(trainer.strategy_state["uid"].clone())

        def post(opt, args, kwargs, r=r, whole=whole):
            group = opt.param_groups[0]
            d = []
            for p in group["params"]:
                st = opt.state[p]
                v_hat = st["exp_avg_sq"] / (1 - group["betas"][1] ** float(st["step"]))
                d.append(v_hat.sqrt() + group["eps"])
            r["denom"].append(d[0] if whole else torch.cat([x.reshape(-1) for x in d]))

        opt.register_step_pre_hook(pre)
        opt.register_step_post_hook(post)
    return rec


def train(ctx, cfg: Config, replay_shards: int = 0, float64: bool = False, record: bool = False,
          drop_rank_grad: int = -1, anisotropic: float = 0.0, no_app_all_reduce: bool = False,
          grad_error: float = 0.0) -> Dict[str, Any]:
    """Sets up, trains, returns this rank's parameters, metrics and a fixed-view render.
    record: also each step's gradients and Adam denominators (record_adam).
    drop_rank_grad: a deliberate bug for mutation checks: that rank zeroes its gradients, or
    with grad_error > 0 multiplies each component by 1 + grad_error x (seeded N(0, 1)): an
    error far above float64 rounding that no tolerance tuned in Adam steps would see.
    no_app_all_reduce: another (--app_opt): each rank steps on its own share of the MLP's gradient."""
    if no_app_all_reduce:
        import distsplat.train.model.app_opt as app_opt

        app_opt.all_reduce_sum = lambda x: x
    cls = ReplayTrainer if replay_shards else Trainer
    cls.shards = replay_shards or 2
    trainer = cls(copy.deepcopy(cfg), ctx)
    try:
        trainer.setup()
        if float64:
            to_float64(trainer, len(trainer._batch(0).cameras), anisotropic)
        events = _count_events(trainer) if float64 else {}
        rec = record_adam(trainer) if record else None
        if drop_rank_grad == ctx.rank:
            gen = torch.Generator().manual_seed(5)

            def drop(opt, args, kwargs):
                g = opt.param_groups[0]["params"][0].grad
                if grad_error:
                    g.mul_(1 + grad_error * torch.randn(g.shape, generator=gen, dtype=g.dtype))
                else:
                    g.zero_()

            for opt in trainer.optimizers.values():
                opt.register_step_pre_hook(drop)
        metrics = trainer.train()
        out = {"params": _params(trainer), "metrics": metrics, "render": fixed_view_render(trainer),
               "counts": gather_counts(len(trainer.params["means"]), torch.device("cpu")),
               "local_cap": getattr(trainer.strategy, "cap_max", None), "rng": torch.get_rng_state(),
               "uid": trainer.strategy_state["uid"].clone(), "events": events,
               "seed": trainer.strategy_state.get("seed"),
               "pose": None if getattr(trainer, "pose", None) is None else trainer.pose.deltas.detach().clone(),
               "app": _app(trainer), "bilagrid": _bilagrid(trainer)}
        if rec is not None:  # per step: lists (rows change at refine steps), learning rates [T]
            out["adam"] = {k: (r if k == "uid" else {**r, "lr": torch.tensor(r["lr"])}) for k, r in rec.items()}
        return out
    finally:
        trainer.cleanup()


def _count_events(trainer: Trainer) -> Dict[str, Any]:
    """Counts this rank's duplicated, split and pruned Gaussians and records, at each refine
    step, what every decision was taken on (by wrapping the strategy's grow and prune): the
    Gaussians' ids, their mean 2D gradient (grow_grad2d), largest scale (grow_scale3d and
    prune_scale3d, x scene scale) and opacity (prune_opa), with the thresholds; and the
    parameters a split's children are made of (test_trainer.py: which decisions were near
    enough their threshold to flip, and the bound the children inherit)."""
    s = trainer.strategy
    events: Dict[str, Any] = {"dupli": 0, "split": 0, "prune": 0, "grow": [], "prune_at": []}

    def size(params):
        return torch.exp(params["scales"].detach()).max(dim=-1).values

    def grow_gs(params, optimizers, st, step):
        events["grow"].append({
            "step": step, "uid": st["uid"].clone(), "grad": (st["grad2d"] / st["count"].clamp_min(1)).double(),
            "size": size(params).double(), "grad_thr": s.grow_grad2d, "size_thr": s.grow_scale3d * st["scene_scale"],
            **{k: params[k].detach().clone() for k in ("means", "scales", "quats")}})
        n_dupli, n_split = grow(params, optimizers, st, step)
        events["dupli"] += n_dupli
        events["split"] += n_split
        return n_dupli, n_split

    def prune_gs(params, optimizers, st, step):
        events["prune_at"].append({
            "step": step, "uid": st["uid"].clone(), "opacity": torch.sigmoid(params["opacities"].detach()).double(),
            "size": size(params).double(), "opacity_thr": s.prune_opa,
            "size_thr": s.prune_scale3d * st["scene_scale"] if step > s.reset_every else None})
        n = prune(params, optimizers, st, step)
        events["prune"] += n
        return n

    grow, prune = s._grow_gs, s._prune_gs
    s._grow_gs, s._prune_gs = grow_gs, prune_gs
    return events


def resume(ctx, cfg: Config) -> Dict[str, Any]:
    """Sets up from cfg.ckpt (no training) and renders the fixed view."""
    trainer = Trainer(copy.deepcopy(cfg), ctx)
    try:
        trainer.setup()
        if trainer.params["means"].dtype == torch.float64:  # a float64 run's checkpoint
            trainer.Ks = trainer.evaluator.Ks = trainer.Ks.double()  # the poses follow it
        return {"params": _params(trainer), "render": fixed_view_render(trainer),
                "start_step": trainer.start_step, "rng": torch.get_rng_state(),
                "uid": trainer.strategy_state["uid"].clone(),
                "pose": None if getattr(trainer, "pose", None) is None else trainer.pose.deltas.detach().clone(),
                "app": _app(trainer), "bilagrid": _bilagrid(trainer)}
    finally:
        trainer.cleanup()


def rebalance(ctx, cfg: Config) -> Dict[str, Any]:
    """Prunes most of rank 1's Gaussians (as densification may), then rebalances: every
    Gaussian must survive exactly once, in order, and the render must not change."""
    from gsplat.strategy.ops import remove

    trainer = Trainer(copy.deepcopy(cfg), ctx)
    try:
        trainer.setup()
        for step in range(cfg.max_steps - 2):  # a few steps: Adam moments are non-zero (2 more after)
            trainer.train_step(step)
        if ctx.rank == 1:
            mask = torch.zeros(len(trainer.params["means"]), dtype=torch.bool)
            mask[3:] = True
            remove(trainer.params, trainer.optimizers, trainer.strategy_state, mask)
        before = _params(trainer)
        moments = {k: trainer.optimizers[k].state[p]["exp_avg"].clone() for k, p in trainer.params.items()}
        render_before = fixed_view_render(trainer)
        counts = gather_counts(len(trainer.params["means"]), torch.device("cpu"))
        trainer._rebalance(counts)
        after_counts = gather_counts(len(trainer.params["means"]), torch.device("cpu"))
        moments_after = {k: trainer.optimizers[k].state[p]["exp_avg"].clone() for k, p in trainer.params.items()}
        out = {"before": before, "after": _params(trainer), "counts": counts, "after_counts": after_counts,
               "moments": moments, "moments_after": moments_after,
               "render_before": render_before, "render_after": fixed_view_render(trainer),
               "bounds": chunk_bounds(sum(counts), ctx.world_size)}
        for step in range(cfg.max_steps - 2, cfg.max_steps):  # Adam steps on the moved rows and moments
            trainer.train_step(step)
        state = [trainer.optimizers[k].state[p] for k, p in trainer.params.items()]
        out["finite_after_steps"] = bool(all(torch.isfinite(p).all() for p in trainer.params.values())
                                         and all((s["exp_avg_sq"] >= 0).all() for s in state))
        return out
    finally:
        trainer.cleanup()


def mcmc_config(result_dir: str, cap: int) -> Config:
    return tiny_config(
        result_dir, max_steps=40, opacity_reg=0.01, scale_reg=0.01, init_opa=0.5, init_scale=0.1,
        strategy=MCMCStrategy(cap_max=cap, refine_start_iter=5, refine_every=5, refine_stop_iter=1000),
    )


def train_work_meter(ctx, cfg: Config) -> Dict[str, Any]:
    """Trains, recording every render's meta["comm"] on this rank (one render per step on the
    tiny scene): the test recomputes the work imbalance from them."""
    import distsplat.train.trainer as trainer_mod

    original, comms = trainer_mod.distributed_rasterize, []

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        comms.append(dict(out[2]["comm"]))
        return out

    trainer_mod.distributed_rasterize = recording
    trainer = Trainer(copy.deepcopy(cfg), ctx)
    try:
        trainer.setup()
        metrics = trainer.train()
    finally:
        trainer_mod.distributed_rasterize = original
        trainer.cleanup()
    return {"metrics": metrics, "comms": comms}
