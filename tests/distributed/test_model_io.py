"""Models in and out on gloo ranks (issue 46, point 2): a model distsplat trained, written in
gsplat's checkpoint layout and read back the way gsplat's trainer reads it, is the same model
and scores the same; a checkpoint made by gsplat's own trainer code path (its ParameterDict of
splats, its DefaultStrategy's state and growth ops, its per-rank files) evaluates to the PSNR
its Gaussians give, goes on training from its step, and seeds a run as a PLY."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer_workers import tiny_config

KEYS = ("means", "scales", "quats", "opacities", "sh0", "shN")


def gsplat_load(files):
    """gsplat 1.5.3's `--ckpt` (simple_trainer.main): every file loaded, each tensor of the splats
    concatenated in the list's order."""
    ckpts = [torch.load(f, map_location="cpu", weights_only=True) for f in files]
    return {k: torch.cat([c["splats"][k] for c in ckpts]) for k in KEYS}, ckpts[0]["step"]


def cat(results, key="params"):
    return {k: torch.cat([r[key][k] for r in results]) for k in KEYS}


def test_a_trained_model_through_gsplats_layout_is_the_same_model(run_workers, tmp_path):
    """W=2 trains and saves; W=3 converts the checkpoint to gsplat's per-rank files (each rank its
    chunk, as gsplat's distributed mode writes them); gsplat's reading of them gives exactly the
    trained Gaussians, so they render identically, and --eval_only of them (one file given: its
    siblings come along), of the checkpoint and of the PLY converted from them score the same."""
    run = tmp_path / "run"
    trained = run_workers("trainer_workers:train", 2, tiny_config(str(run), max_steps=8, save_steps=[8]))
    conv = tmp_path / "gsplat"
    run_workers("gsplat_user_workers:convert", 3, str(run / "ckpts"), str(conv))
    files = sorted(conv.iterdir())
    assert [p.name for p in files] == [f"ckpt_8_rank{r}.pt" for r in range(3)]
    splats, step = gsplat_load(files)
    assert step == 8
    want = cat(trained)
    for k in KEYS:
        assert torch.equal(splats[k], want[k]), k

    from distsplat.render import rasterize
    from distsplat.train.model.gaussians import activated
    from distsplat.train.scene_setup import load_scene

    scene = load_scene(tiny_config("unused"))
    images = []
    for params in (want, splats):
        g = activated(params, 1)
        with torch.no_grad():
            images.append(rasterize(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                                    scene.viewmats(scene.test), torch.from_numpy(scene.Ks[scene.test]).float(), 32, 24,
                                    sh_degree=1, backend="torch")[0])
    assert torch.equal(images[0], images[1]) and images[0].std() > 0.05

    run_workers("gsplat_user_workers:convert", 1, str(files[1]), str(tmp_path / "model.ply"), "ply")
    scores = {}
    for name, ckpt in (("ckpt", run / "ckpts"), ("gsplat", files[2]), ("ply", tmp_path / "model.ply")):
        cfg = tiny_config(str(tmp_path / f"eval_{name}"), ckpt=str(ckpt), eval_only=True)
        r0 = run_workers("gsplat_user_workers:run", 2, cfg)[0]
        scores[name] = (r0["metrics"]["val_psnr"], r0["metrics"]["val_ssim"], r0["n_all"])
    assert scores["gsplat"] == scores["ckpt"] == scores["ply"], scores
    assert scores["ckpt"][2] == len(want["means"])


def knn_scales(points: torch.Tensor) -> torch.Tensor:
    """gsplat's initial log scales: the mean distance to the 3 nearest other points, isotropic."""
    d = torch.cdist(points, points)
    d2 = (d.topk(4, largest=False).values[:, 1:] ** 2).mean(-1)
    return torch.log(d2.sqrt())[:, None].repeat(1, 3)


def gsplat_checkpoint(folder: Path, world_size: int, step: int, sh_degree: int = 1) -> dict:
    """A checkpoint as gsplat 1.5.3's trainer makes it, on CPU: create_splats_with_optimizers' model
    (SfM points, kNN scales, random quaternions, opacity 0.1, SH DC from the points' colours),
    dealt to its ranks as it deals them (rank r: rows r::W), each rank's DefaultStrategy state
    and optimizers, some Gaussians grown by gsplat's own duplicate and split ops (which append
    each rank's newborns to its rows), then `{"step", "splats": splats.state_dict()}` per rank in
    ckpt_{step}_rank{r}.pt. Returns the model as gsplat's --ckpt concatenates it."""
    from gsplat.strategy import DefaultStrategy
    from gsplat.strategy.ops import duplicate, split

    from distsplat.train.scene_setup import load_scene

    scene = load_scene(tiny_config("unused"))
    points = torch.from_numpy(scene.points).float()
    rgbs = torch.from_numpy(scene.points_rgb).float() / 255.0
    gen = torch.Generator().manual_seed(42)
    scales = knn_scales(points)
    files = []
    for r in range(world_size):
        rows = slice(r, None, world_size)
        n = len(points[rows])
        sh = torch.zeros(n, (sh_degree + 1) ** 2, 3)
        sh[:, 0] = (rgbs[rows] - 0.5) / 0.28209479177387814
        splats = torch.nn.ParameterDict({
            "means": torch.nn.Parameter(points[rows].clone()), "scales": torch.nn.Parameter(scales[rows].clone()),
            "quats": torch.nn.Parameter(torch.rand(n, 4, generator=gen)),
            "opacities": torch.nn.Parameter(torch.logit(torch.full((n,), 0.1))),
            "sh0": torch.nn.Parameter(sh[:, :1].clone()), "shN": torch.nn.Parameter(sh[:, 1:].clone())})
        optimizers = {k: torch.optim.Adam([{"params": splats[k], "lr": 1e-3, "name": k}], eps=1e-15)
                      for k in splats}
        strategy = DefaultStrategy(verbose=False)
        strategy.check_sanity(splats, optimizers)
        state = strategy.initialize_state(scene_scale=1.0)
        torch.manual_seed(r)  # gsplat's split draws from torch's global generator
        duplicate(splats, optimizers, state, torch.arange(n) % 7 == 0)
        split(splats, optimizers, state, torch.arange(len(splats["means"])) % 11 == 0)
        path = folder / f"ckpt_{step}_rank{r}.pt"
        torch.save({"step": step, "splats": splats.state_dict()}, path)
        files.append(path)
    return gsplat_load(files)[0]


def test_a_gsplat_trainer_checkpoint_evaluates_to_its_psnr_and_trains_on(run_workers, tmp_path):
    from torchmetrics.image import PeakSignalNoiseRatio

    from distsplat.render import rasterize
    from distsplat.train.model.gaussians import activated
    from distsplat.train.scene_setup import load_scene, render_ground_truth

    folder = tmp_path / "gsplat_run" / "ckpts"
    folder.mkdir(parents=True)
    model = gsplat_checkpoint(folder, 2, 123)
    assert len(model["means"]) > 400  # grown by gsplat's ops from the scene's 400 points

    # The PSNR its Gaussians give: one process renders every test camera, torchmetrics scores it
    scene = load_scene(tiny_config("unused"))
    g = activated(model, 1)
    psnr = PeakSignalNoiseRatio(data_range=1.0)
    ref = []
    for i in scene.test:
        with torch.no_grad():
            img = rasterize(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"], scene.viewmats([i]),
                            torch.from_numpy(scene.Ks[[i]]).float(), 32, 24, sh_degree=1, backend="torch")[0]
        gt = torch.from_numpy(render_ground_truth(scene, int(i))).float()[None] / 255.0
        ref.append(float(psnr(img.clamp(0, 1).permute(0, 3, 1, 2), gt.permute(0, 3, 1, 2))))
    cfg = tiny_config(str(tmp_path / "eval"), ckpt=str(folder / "ckpt_123_rank1.pt"), eval_only=True)
    r0 = run_workers("gsplat_user_workers:run", 2, cfg)[0]
    assert r0["start_step"] == 123 and r0["n_all"] == len(model["means"])
    assert r0["metrics"]["val_psnr"] == pytest.approx(float(np.mean(ref)), abs=1e-4)
    assert math.isfinite(r0["metrics"]["val_psnr"]) and r0["metrics"]["val_psnr"] > 8

    # Training goes on from gsplat's step, on 3 ranks: its Gaussians, fresh optimizer state
    cfg = tiny_config(str(tmp_path / "train"), ckpt=str(folder / "ckpt_123_rank0.pt"), max_steps=126,
                      save_steps=[126])
    rs = run_workers("gsplat_user_workers:run", 3, cfg)
    assert all(r["start_step"] == 123 for r in rs)
    initial = cat(rs, "initial")
    for k in KEYS:
        assert torch.equal(initial[k], model[k]), k
    assert (cat(rs)["means"] - model["means"]).abs().max() > 0  # trained
    assert (tmp_path / "train" / "ckpts" / "step_000126" / "meta.json").is_file()


def test_init_ply_seeds_a_run_from_step_0(run_workers, tmp_path):
    """--init_type ply from a PLY gsplat's exporter wrote (no normals): every rank's rows are the
    file's (the built-in scene's world is the capture's: nothing moves)."""
    from gsplat import export_splats

    model = gsplat_checkpoint(tmp_path, 1, 5)
    export_splats(**{k: v.detach() for k, v in model.items()}, format="ply", save_to=str(tmp_path / "m.ply"))
    cfg = tiny_config(str(tmp_path / "init"), init_type="ply", init_ply=str(tmp_path / "m.ply"), max_steps=2)
    rs = run_workers("gsplat_user_workers:run", 2, cfg)
    assert all(r["start_step"] == 0 for r in rs)
    initial = cat(rs, "initial")
    for k in KEYS:
        assert torch.equal(initial[k], model[k].float()), k
