"""From --data_dir to a `Scene` whose images can be read: COLMAP, Blender or nerfstudio folders, or the
built-in synthetic scene, whose ground-truth images this layer renders (the data layer
never renders): each rank renders only the images of cameras it owns, when first read."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..data import DataError, Scene, load_blender, load_colmap, load_nerfstudio, make_synthetic_scene
from ..data.synthetic import attach_images
from ..data.tabletop import make_tabletop_scene
from ..render import rasterize
from .config import Config

log = logging.getLogger(__name__)


def load_scene(cfg: Config) -> Scene:
    """The scene of cfg.data_dir, or the synthetic scene when it is None. Raises DataError
    (a ValueError) naming the folder when it is not a scene."""
    if cfg.data_dir is None:
        s = cfg.synthetic
        if s.kind == "tabletop":
            scene = make_tabletop_scene(num_cameras=s.num_cameras, width=s.width, height=s.height,
                                        detail=s.detail, test_every=cfg.test_every, seed=s.seed)
        else:
            scene = make_synthetic_scene(
                num_cameras=s.num_cameras, num_gaussians=s.num_gaussians, width=s.width,
                height=s.height, test_every=cfg.test_every, seed=s.seed,
            )
        return attach_images(scene, lambda i: render_ground_truth(scene, i))
    root = Path(cfg.data_dir)
    if not root.is_dir():
        raise DataError(f"--data_dir {root} does not exist or is not a folder")
    if (root / "transforms_train.json").is_file():
        return load_blender(root, normalize=cfg.normalize_world_space)
    if (root / "sparse").is_dir():
        return load_colmap(root, factor=cfg.data_factor, normalize=cfg.normalize_world_space,
                           test_every=cfg.test_every, check=not cfg.node_local_data)  # node_data.py checks own images
    if (root / "transforms.json").is_file():
        return load_nerfstudio(root, factor=cfg.data_factor, normalize=cfg.normalize_world_space,
                               test_every=cfg.test_every)
    raise DataError(
        f"--data_dir {root} is not a scene: expected a COLMAP capture (images/ and sparse/0/), "
        "a Blender/NeRF-synthetic folder (transforms_train.json) or a nerfstudio capture "
        "(transforms.json); omit --data_dir to train on the built-in synthetic scene"
    )


def render_ground_truth(scene: Scene, index: int) -> np.ndarray:
    """[H, W, 3] uint8 image of the synthetic scene's ground-truth Gaussians at camera
    index (rendered with the torch backend on CPU: the scene is tiny)."""
    g = {k: torch.from_numpy(v) for k, v in scene.gaussians.items()}
    viewmat = torch.from_numpy(np.linalg.inv(scene.camtoworlds[index])).float()[None]
    K = torch.from_numpy(scene.Ks[index]).float()[None]
    with torch.no_grad():
        colors, _, _ = rasterize(
            g["means"], g["quats"], g["scales"], g["opacities"], g["colors"], viewmat, K,
            int(scene.widths[index]), int(scene.heights[index]), backend="torch",
        )
    return (colors[0].clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def scene_scale(scene: Scene, global_scale: float = 1.0) -> float:
    """gsplat's scene scale: the largest camera distance from the cameras' centroid, x1.1."""
    centers = scene.camtoworlds[:, :3, 3]
    radius = float(np.linalg.norm(centers - centers.mean(0), axis=1).max())
    return max(radius, 1e-6) * 1.1 * global_scale


def check_single_size(scene: Scene, indices: Optional[np.ndarray] = None) -> None:
    """A batch is rendered at one size: refuse scenes whose images differ in size."""
    idx = np.arange(scene.num_cameras) if indices is None else np.asarray(indices)
    wh = np.stack([scene.widths[idx], scene.heights[idx]], 1)  # [C, 2]
    if len(wh) == 0 or (wh == wh[0]).all():  # one size: no per-camera Python objects (a million cameras)
        return
    uniq, inverse = np.unique(wh, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    sizes = {(int(w), int(h)): idx[inverse == g].tolist() for g, (w, h) in enumerate(uniq.tolist())}
    if len(sizes) > 1:
        where = scene.images.where if scene.images is not None else scene.names.__getitem__
        counts = sorted(sizes.items(), key=lambda kv: -len(kv[1]))
        listed = ", ".join(f"{len(c)} at {w}x{h} (e.g. {where(c[0])})" for (w, h), c in counts[:3])
        undistorted = scene.undistort is not None and any(u is not None for u in scene.undistort)
        raise DataError(
            f"the scene's images have {len(sizes)} different sizes: {listed}; distsplat renders each "
            "batch at one size: resize the images to one size"
            + (" (distorted cameras are undistorted to pinhole crops of their own size: cameras of different "
               "models or distortions give different sizes, and mixed sizes are not supported yet)" if undistorted else "")
        )
