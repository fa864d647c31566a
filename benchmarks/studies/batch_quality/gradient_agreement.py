"""How much the training views agree on each parameter's gradient at the start (issue 45.2):
rho = s^2 / (s^2 + sigma^2) per parameter group, s a parameter's mean gradient over the images
that see it, sigma^2 their variance (docs/training.md, densification at any global batch: a
batch step at --lr_batch_scaling visibility moves a parameter up to sqrt(1 + (B - 1) p) times
further per image than batch 1 where rho is small; the visibility rule with p rho in place of p
moves it as far).

One process at batch 1 with every learning rate 0 (the parameters stay the initial ones) runs
IMAGES steps (distinct training images: the batcher's first epoch); each step's gradient of
every parameter is recorded by hooks. Per group: rho = sum over the Gaussians' components of
mean(g)^2 / sum of mean(g^2), over the images that see the Gaussian (opacity gradient nonzero),
Gaussians seen by at least 2 of them; also p, the fraction of (Gaussian, image) pairs seen.

    nice -n 10 python benchmarks/studies/batch_quality/gradient_agreement.py
    SCENE=builtin IMAGES=16 python benchmarks/studies/batch_quality/gradient_agreement.py

Environment (defaults): SCENE (thermos | builtin), FACTOR (16: thermos' --data_factor), IMAGES (16),
NAME (gradient_agreement_<scene>)."""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.paths import data_dir  # noqa: E402

GROUPS = ("means", "scales", "quats", "opacities", "sh0")


def main() -> None:
    import torch

    from distsplat import cli
    from distsplat.train.model.strategies import DefaultStrategy

    scene, images = os.environ.get("SCENE", "thermos"), int(os.environ.get("IMAGES", "16"))
    grads = {k: [] for k in GROUPS}

    @dataclasses.dataclass
    class Recording(DefaultStrategy):
        def step_pre_backward(self, params, optimizers, state, step, info):
            if step == 0:  # the parameters are never replaced: no refine step runs
                for k in GROUPS:
                    params[k].register_hook(lambda g, k=k: grads[k].append(g.detach().double().clone()))
            return super().step_pre_backward(params, optimizers, state, step, info)

    data = [] if scene == "builtin" else ["--data_dir", str(Path(data_dir()) / scene),
                                          "--data_factor", os.environ.get("FACTOR", "16")]
    with tempfile.TemporaryDirectory(prefix="gradient_agreement_") as tmp:
        never = str(10 ** 6)
        argv = ["default", "--max_steps", str(images), "--eval_steps", never, "--save_steps", never, "--no-save-ply",
                "--result_dir", tmp, "--num_workers", "1", "--strategy.refine_start_iter", str(10 ** 6),
                *[a for k in ("means", "scales", "quats", "opacities", "sh0", "shN") for a in (f"--{k}_lr", "0")],
                *data]
        cfg = cli.parse(argv)
        s = cfg.strategy
        cfg.strategy = Recording(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)})
        cli.run(cfg)
    seen = torch.stack([g.reshape(len(g), -1).abs().sum(-1) > 0 for g in grads["opacities"]])  # [I, N]
    n_seen = seen.sum(0)  # [N]
    keep = n_seen >= 2
    out = {}
    for k in GROUPS:
        g = torch.stack([x.reshape(len(x), -1) for x in grads[k]])  # [I, N, D]
        m = seen[..., None].double()
        mean = (g * m).sum(0) / n_seen.clamp_min(1)[:, None]  # [N, D] over the images that see it
        sq = (g ** 2 * m).sum(0) / n_seen.clamp_min(1)[:, None]
        rho_each = (mean ** 2 / sq.clamp_min(1e-300))[keep]  # [N_keep, D]
        out[k] = {"rho": float((mean[keep] ** 2).sum() / sq[keep].sum()),
                  "rho_median": float(rho_each.median()), "rho_q10_q90": rho_each.quantile(
                      torch.tensor([0.1, 0.9], dtype=torch.float64)).tolist()}
    p = float(seen.double().mean())
    summary = {k: round(v["rho"], 4) for k, v in out.items()}
    print(f"gradient_agreement {scene}: p {p:.3f} over {images} images, {int(keep.sum())} Gaussians seen twice or "
          f"more; rho {summary}", flush=True)
    path = write_result(os.environ.get("NAME", f"gradient_agreement_{scene}"), {
        "command": "python benchmarks/studies/batch_quality/gradient_agreement.py" + "".join(
            f" {k}={os.environ[k]}" for k in ("SCENE", "FACTOR", "IMAGES") if k in os.environ),
        "note": ("batch 1, every learning rate 0 (the initial parameters), one training image per step; per group "
                 "rho = sum mean(g)^2 / sum mean(g^2) over the images that see each Gaussian (>= 2 of them); "
                 "rho_median and quantiles per component. p: the fraction of (Gaussian, image) pairs seen."),
        "scene": scene, "images": images, "p": p, "gaussians_kept": int(keep.sum()), "groups": out})
    print(f"gradient_agreement: wrote {path}")


if __name__ == "__main__":
    main()
