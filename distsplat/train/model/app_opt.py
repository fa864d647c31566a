"""Appearance optimization (`--app_opt`): gsplat's AppearanceOptModule, distributed.

Each Gaussian carries learned `features` [N, 32] and a base colour `colors` [N, 3] (logit)
instead of SH coefficients; its colour in training image i is

    sigmoid(colors + MLP([embed_i, features, SH bases of the view direction]))

with embed_i [16] one learned vector per training image and the MLP gsplat's (64 wide, two
hidden ReLU layers, last layer zero at start so training starts from the base colours).
Test images, the render-only path, the viewer and the PLY use a zero embedding, as gsplat.

Where the state lives (docs/design.md): the colour of a pair is computed by the rank that
renders its camera (distributed_rasterize's pair_colors: the payload carries the features
and the pair's direction), so
- an image's embedding lives only on its owner rank, and only that rank's pairs reach it:
  its gradient is complete on that rank, no collective. Adam is elementwise, so each
  rank's Adam over its own rows takes exactly the steps one process's Adam over all rows
  takes (every row steps every step, a zero gradient for images not in the batch, as
  torch.nn.Embedding's dense gradient gives in gsplat);
- the MLP is replicated, identical on every rank; every rank's pairs add to its gradient,
  so after backward the flattened gradient is summed with ONE all-reduce per step and
  every rank takes the same Adam step.
A checkpoint holds every embedding row (owners' rows summed into one table at save time,
one all-reduce per save) in shard 0, so it resumes on any W.

Learning rates as gsplat: embeddings app_opt_lr x sqrt(B) x 10 with weight decay
app_opt_reg, MLP app_opt_lr x sqrt(B), B the global batch (as pose_opt.py).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ...distributed import all_reduce_sum
from ...render.gather import gather_rows
from ...transfer import to_device
from .gaussians import adam_step, rgb_to_sh

FEATURE_DIM = 32  # gsplat's feature_dim with --app_opt
MLP_WIDTH, MLP_DEPTH = 64, 2  # gsplat's AppearanceOptModule defaults


def sh_bases(dirs: Tensor, sh_degree: int, max_degree: int) -> Tensor:
    """dirs [M, 3] (unnormalised) -> [M, (max_degree+1)^2] real SH bases of the unit
    directions, the columns past `sh_degree` zero (gsplat's progressive SH degree). A zero
    direction gives only the constant basis (the PLY's bake)."""
    from ...gsplat_compat import sh_bases_torch  # deferred: torch maths, nothing compiled

    k, k_max = (sh_degree + 1) ** 2, (max_degree + 1) ** 2
    b = sh_bases_torch(k, F.normalize(dirs, dim=-1))  # [M, k]
    return F.pad(b, (0, k_max - k))


class Appearance:
    """This rank's embeddings (its own training images' rows), the replicated colour MLP
    and their two Adams."""

    def __init__(self, n_train: int, own: Tensor, embed_dim: int, sh_degree: int, lr: float, reg: float,
                 global_batch: int, seed: int, device: torch.device, dtype: torch.dtype = torch.float32):
        self.n_train, self.embed_dim, self.sh_degree = n_train, embed_dim, sh_degree
        self.lr, self.reg, self.global_batch = lr, reg, global_batch
        self.own = own.to(torch.int64).cpu()  # [n_own] training positions this rank owns
        # Training position -> local row; others -> n_own, a zero row (never rendered here).
        self.row = torch.full((n_train,), len(self.own), dtype=torch.int64)
        self.row[self.own] = torch.arange(len(self.own))
        # The same draws whatever W: every row from one seeded generator (nn.Embedding's
        # N(0, 1), gsplat's), this rank's rows kept; the MLP from the same generator.
        g = torch.Generator().manual_seed(seed * 1_000_033 + 7)
        self.embeds = torch.nn.Parameter(torch.randn(n_train, embed_dim, generator=g)[self.own].to(device, dtype))
        layers: List[torch.nn.Module] = []
        width_in = embed_dim + FEATURE_DIM + (sh_degree + 1) ** 2
        for i in range(MLP_DEPTH):
            layers += [torch.nn.Linear(width_in if i == 0 else MLP_WIDTH, MLP_WIDTH), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(MLP_WIDTH, 3))
        self.mlp = torch.nn.Sequential(*layers)
        with torch.no_grad():
            for lin in self.mlp[:-1]:
                if isinstance(lin, torch.nn.Linear):  # torch's default init, from our generator
                    bound = 1.0 / math.sqrt(lin.in_features)
                    lin.weight.copy_(torch.rand(lin.weight.shape, generator=g) * 2 * bound - bound)
                    lin.bias.copy_(torch.rand(lin.bias.shape, generator=g) * 2 * bound - bound)
            self.mlp[-1].weight.zero_()  # gsplat: the initial output is zero
            self.mlp[-1].bias.zero_()
        self.mlp.to(device, dtype)
        self._make_optimizers()

    def _make_optimizers(self) -> None:
        s = math.sqrt(self.global_batch)
        # fused: the one Adam that skips a diverged step on the device (gaussians.adam_step)
        self.embed_opt = torch.optim.Adam([self.embeds], lr=self.lr * s * 10.0, weight_decay=self.reg, fused=True)
        self.mlp_opt = torch.optim.Adam(self.mlp.parameters(), lr=self.lr * s, fused=True)

    def to(self, dtype: torch.dtype) -> None:
        """Another dtype (tests train in float64), with fresh optimizers."""
        self.embeds = torch.nn.Parameter(self.embeds.detach().to(dtype))
        self.mlp.to(dtype)
        self._make_optimizers()

    # -------------------------------------------------------------------- colours
    def pair_colors(self, sh_degree: int, cameras: Optional[Tensor]) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        """distributed_rasterize's pair_colors for one call: `cameras` [C] are the training
        positions of the call's cameras (None: a zero embedding, test images and paths)."""
        table = None
        if cameras is not None:
            rows = self.row[cameras.cpu()]  # [C]
            rows = to_device(rows, self.embeds.device)  # queued on a CUDA stream: no host sync in the step
            table = torch.cat([self.embeds, self.embeds.new_zeros(1, self.embed_dim)])[rows]  # [C, D]

        def colors(features: Tensor, dirs: Tensor, cams: Tensor) -> Tensor:  # [M, 35], [M, 3], [M]
            if table is None:
                embeds = features.new_zeros(len(features), self.embed_dim)
            else:
                embeds = gather_rows(table, cams).to(features.dtype)  # [M, D]; backward: index_add_, no sort
            return self.colors(features, dirs, embeds, sh_degree)

        return colors

    def colors(self, features: Tensor, dirs: Tensor, embeds: Tensor, sh_degree: int) -> Tensor:
        """features [M, 32 + 3] (features, base colour logits), dirs [M, 3], embeds [M, D]
        -> colours [M, 3] in (0, 1)."""
        feats, base = features[:, :FEATURE_DIM], features[:, FEATURE_DIM:]
        h = torch.cat([embeds, feats, sh_bases(dirs, sh_degree, self.sh_degree).to(feats.dtype)], dim=-1)
        return torch.sigmoid(self.mlp(h) + base)

    @torch.no_grad()
    def baked(self, params: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """The Gaussians with SH colours for the standard PLY, as gsplat bakes them: the
        colour at a zero embedding and a zero direction (only the constant SH basis) as the
        DC term, no higher-order terms."""
        n = len(params["means"])
        feats = torch.cat([params["features"], params["colors"]], 1)
        rgb = self.colors(feats, torch.zeros_like(params["means"]), feats.new_zeros(n, self.embed_dim),
                          self.sh_degree)  # [N, 3]
        out = {k: params[k] for k in ("means", "scales", "quats", "opacities")}
        out.update(sh0=rgb_to_sh(rgb)[:, None, :], shN=rgb.new_zeros(n, 0, 3))
        return out

    # ----------------------------------------------------------------------- step
    def grads(self) -> Dict[str, Tensor]:
        """The learned tensors, for the divergence guard's finiteness check."""
        return {"app_embeds": self.embeds, **{f"app_mlp{i}": p for i, p in enumerate(self.mlp.parameters())}}

    def zero_grad(self) -> None:
        self.embed_opt.zero_grad(set_to_none=True)
        self.mlp_opt.zero_grad(set_to_none=True)

    def step(self, found_inf: Optional[Tensor] = None) -> None:
        """After backward, on every rank: the MLP's gradient summed over ranks (ONE
        all-reduce of the flattened gradient), then the same Adam step everywhere; the
        embeddings' Adam on this rank's rows (their gradient is complete here). Neither
        steps where `found_inf` [] is 1.0 (the divergence check, on every rank's own
        gradients before this sum)."""
        ps = list(self.mlp.parameters())
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])
        flat = all_reduce_sum(flat)
        at = 0
        for p in ps:
            p.grad = flat[at:at + p.numel()].view_as(p).clone()
            at += p.numel()
        if self.embeds.grad is None:  # no own image in the batch: Adam still steps (momentum, decay)
            self.embeds.grad = torch.zeros_like(self.embeds)
        adam_step(self.embed_opt, found_inf)
        adam_step(self.mlp_opt, found_inf)
        self.zero_grad()

    # ----------------------------------------------------------------- checkpoint
    def state_dict(self) -> Dict[str, Any]:
        """Every rank calls it (one all-reduce): the whole embedding table and its Adam
        moments [n_train, D] (owners' rows summed into zeros), the MLP and its Adam."""
        st = self.embed_opt.state.get(self.embeds, {})
        parts = [self.embeds.detach()] + [st.get(k, torch.zeros_like(self.embeds)).detach()
                                          for k in ("exp_avg", "exp_avg_sq")]
        full = self.embeds.new_zeros(3, self.n_train, self.embed_dim)
        full[:, self.own.to(full.device)] = torch.stack(parts)
        full = all_reduce_sum(full).cpu()
        return {"embeds": full[0], "exp_avg": full[1], "exp_avg_sq": full[2],
                "step": st.get("step", torch.tensor(0.0)).detach().cpu(),
                "mlp": {k: v.detach().cpu() for k, v in self.mlp.state_dict().items()},
                "mlp_optimizer": self.mlp_opt.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """This rank's rows of a checkpoint written on any W."""
        if tuple(state["embeds"].shape) != (self.n_train, self.embed_dim):
            raise ValueError(f"the checkpoint's appearance embeddings are {tuple(state['embeds'].shape)} "
                             f"(training images x --app_embed_dim), this run needs ({self.n_train}, "
                             f"{self.embed_dim}); pass the scene and --app_embed_dim it was trained with")
        dev = self.embeds.device
        own = self.own
        # The saved values and dtype, exactly (a float64 run resumes as one).
        self.embeds = torch.nn.Parameter(state["embeds"][own].to(dev))
        self.mlp.to(state["embeds"].dtype)
        self.mlp.load_state_dict(state["mlp"])
        self._make_optimizers()
        self.mlp_opt.load_state_dict(state["mlp_optimizer"])
        if float(state["step"]) > 0:
            # a fused Adam's step counter: float32 beside its parameter
            self.embed_opt.state[self.embeds] = {"step": state["step"].to(dev, torch.float32, copy=True),
                                                 "exp_avg": state["exp_avg"][own].to(dev),
                                                 "exp_avg_sq": state["exp_avg_sq"][own].to(dev)}

    def table(self) -> Tensor:
        """[n_train, D] with this rank's rows and NaN elsewhere (tests)."""
        out = torch.full((self.n_train, self.embed_dim), float("nan"), dtype=self.embeds.dtype)
        out[self.own] = self.embeds.detach().cpu()
        return out


def setup_app_opt(cfg, n_train: int, own: Tensor, global_batch: int, device: torch.device) -> Optional[Appearance]:
    """The trainer's one call: the appearance model when --app_opt, else None. `own` [n_own]:
    the training positions this rank owns (the batcher's)."""
    if not cfg.app_opt:
        return None
    return Appearance(n_train, own, cfg.app_embed_dim, cfg.sh_degree, cfg.app_opt_lr, cfg.app_opt_reg,
                      global_batch, cfg.seed, device)


def colour_kwargs(app: Optional[Appearance], sh_degree: int, cameras: Optional[Tensor] = None) -> Dict[str, Any]:
    """distributed_rasterize's colour arguments: SH of `sh_degree`, or with --app_opt the
    appearance model (sh_degree None; `cameras` [C] training positions, None: zero embedding)."""
    if app is None:
        return {"sh_degree": sh_degree}
    return {"sh_degree": None, "pair_colors": app.pair_colors(sh_degree, cameras)}


def check_resume(saved_cfg: Dict[str, Any], cfg, where: str) -> None:
    """A checkpoint's colours are SH or appearance features: the run must match."""
    saved = bool(saved_cfg.get("app_opt", False))
    if saved != bool(cfg.app_opt):
        raise ValueError(
            f"--ckpt {where} was trained {'with' if saved else 'without'} --app_opt (its Gaussians carry "
            f"{'appearance features' if saved else 'SH colours'}); "
            f"{'add' if saved else 'drop'} --app_opt to resume it")
