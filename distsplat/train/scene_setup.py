"""From --data_dir (and --data_shards: the images in tar shards) to a `Scene` whose images can be read:
COLMAP, Blender, nerfstudio or instant-ngp folders, or the
built-in synthetic scene, whose ground-truth images this layer renders (the data layer
never renders): each rank renders only the images of cameras it owns, when first read."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List, Optional, Tuple, Union

import numpy as np
import torch

from ..data import DataError, ImageCache, Scene, load_blender, load_colmap, load_nerfstudio, make_synthetic_scene
from ..data.discover import choose, describe_choice
from ..data.heap import TRIM_FROM, trim_heap
from ..data.shards import TarShardSource
from ..data.synthetic import appearance_gains, apply_gains, attach_images
from ..data.tabletop import make_tabletop_scene
from ..render import rasterize
from .config import Config
from ..distributed.nodes import node_name
from .node_data import LISTED, check_own_images, listed

log = logging.getLogger(__name__)


def load_scene(cfg: Config) -> Scene:
    """The scene of cfg.data_dir (its images from --data_shards when given), or the synthetic
    scene when it is None. Raises DataError (a ValueError) naming the folder when it is not a
    scene."""
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
        if s.exposure == 1.0 and s.white_balance == 0.0:
            return attach_images(scene, lambda i: render_ground_truth(scene, i))
        # --synthetic.exposure / white_balance: the training images as a phone's changing ISP makes them
        # (no global bias over the training images: appearance_gains)
        gains = appearance_gains(scene.num_cameras, s.exposure, s.white_balance, s.seed, train=scene.train)
        train = set(scene.train.tolist())
        return attach_images(scene, lambda i: apply_gains(render_ground_truth(scene, i), gains[i]) if i in train
                             else render_ground_truth(scene, i))
    shards = shard_index(cfg.data_dir, cfg.data_shards)
    scene = load_scene_dir(cfg.data_dir, cfg.data_factor, cfg.normalize_world_space, cfg.test_every,
                           check=not checks_own_images(cfg), shards=shards, data_format=cfg.data_format,
                           colmap_dir=cfg.colmap_dir, skip_missing=cfg.skip_missing_images)
    if shards is not None and not cfg.node_local_data:
        check_all_indexed(scene)  # shared shards hold every image; node-local ones only the node's
    return scene


def own_image_cache(cfg: Config, scene: Scene, own: List[int], device: torch.device, rank: int) -> ImageCache:
    """This rank's image cache, of its own cameras `own` (scene indices) only; staged per node
    or in shards, this rank must have every image it owns (node_data.py), checked first."""
    if checks_own_images(cfg):
        check_own_images(scene, own, f"{node_name()}, rank {rank},")
    budget = None if cfg.cache_budget_gb is None else int(cfg.cache_budget_gb * 2**30)
    cache = ImageCache(scene.images, scene.specs(), own, mode=cfg.cache, device=device, budget=budget, rank=rank)
    if scene.num_cameras >= TRIM_FROM:
        trim_heap()  # setup's freed [C_all] temporaries back to the OS (data/heap.py, issue 20)
    return cache


def scene_line(n_train: int, n_test: int, sizes: List[Tuple[int, int]], scale: float, n_all: int, W: int) -> str:
    """Rank 0's line once setup succeeded: cameras, image sizes (the first four), scale, Gaussians."""
    shown = ", ".join(f"{w}x{h}" for w, h in sizes[:4]) + (f" (+{len(sizes) - 4} sizes)" if len(sizes) > 4 else "")
    return f"scene: {n_train} train / {n_test} test cameras at {shown}, scale {scale:.3f}; {n_all} Gaussians on {W} ranks"


def checks_own_images(cfg: Config) -> bool:
    """Whether each rank checks only the images it owns, at setup (train/node_data.py), instead
    of the loader checking every image on every rank: images staged per node (a node lacks the
    others), or tar shards (each rank reads only its own images from them)."""
    return cfg.data_dir is not None and (cfg.node_local_data or cfg.data_shards is not None)


def shard_index(data_dir: Union[str, Path], data_shards: Optional[str]) -> Optional[Path]:
    """--data_shards as a path (relative to --data_dir when relative; a folder means its
    index.json); DataError naming the flag when there is no index there."""
    if data_shards is None:
        return None
    path = Path(data_shards)
    if not path.is_absolute():
        path = Path(data_dir) / path
    if path.is_dir():
        path = path / "index.json"
    if not path.is_file():
        raise DataError(f"--data_shards {data_shards}: no shard index at {path} (a relative path is taken under "
                        f"--data_dir {data_dir}); pack the images with python scripts/pack_shards.py IMAGES OUT "
                        "and pass OUT/index.json, or stage a node's with scripts/stage_nodes.py --shards")
    return path


def check_all_indexed(scene: Scene) -> None:
    """DataError naming the scene's images that its shard index lacks (a cheap lookup of
    every name, no read)."""
    src = scene.images
    absent = src.absent(range(scene.num_cameras)) if isinstance(src, TarShardSource) else []
    if absent:
        names = [repr(scene.names[i]) for i in absent[:LISTED]]
        raise DataError(f"--data_shards {src.index_path}: {len(absent)} of the scene's {scene.num_cameras} images "
                        f"are not in the shards: {listed(names, len(absent))}. Pack the images the model names (COLMAP: the folder "
                        "images_N/ or images/; Blender/nerfstudio: --data_dir, names as the frames' file_path) with "
                        "scripts/pack_shards.py")


def load_scene_dir(data_dir: Union[str, Path], factor: int = 1, normalize: bool = False, test_every: int = 8,
                   check: bool = True, shards: Optional[Path] = None, data_format: str = "auto",
                   colmap_dir: Optional[str] = None, skip_missing: bool = False) -> Scene:
    """The COLMAP, Blender, nerfstudio or instant-ngp scene in `data_dir`, by the files it holds
    (the trainer's and scripts/stage_nodes.py's one way to read a scene): data/discover.py
    finds every description in the folder and picks one (a COLMAP model first, it has the
    points; --data_format or --colmap_dir choose), and one line says which when there was a
    choice. `check=False`: the loader reads one image per camera, the caller checks each
    rank's own (node_data.py). `skip_missing`: --skip_missing_images."""
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"--data_dir {root} does not exist or is not a folder")
    chosen, others = choose(root, data_format, colmap_dir)
    line = describe_choice(root, chosen, others, data_format, colmap_dir)
    if line is not None:
        log.info("%s", line)
    if chosen.format == "blender":
        return load_blender(root, normalize=normalize, check=check, shards=shards, skip_missing=skip_missing)
    if chosen.format == "colmap":
        standard = chosen.path in (root / "sparse" / "0", root / "sparse")  # colmap.find_model's places
        return load_colmap(root, factor=factor, normalize=normalize, test_every=test_every, check=check,
                           shards=shards, model_dir=None if standard else chosen.path, skip_missing=skip_missing)
    return load_nerfstudio(root, factor=factor, normalize=normalize, test_every=test_every, check=check,
                           shards=shards, skip_missing=skip_missing)


def render_ground_truth(scene: Scene, index: int) -> np.ndarray:
    """[H, W, 3] uint8 image of the synthetic scene's ground-truth Gaussians at camera
    index (rendered with the torch backend on CPU: the scene is tiny)."""
    g = {k: torch.from_numpy(v) for k, v in scene.gaussians.items()}
    viewmat = scene.viewmats([index])  # [1, 4, 4]
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


def camera_digest(scene: Scene, train: np.ndarray, batcher_state: dict) -> int:
    """A 62-bit digest of what decides every step's batch cameras: the scene's poses,
    intrinsics and sizes, the training split and the batcher's layout. Ranks that agree on
    it draw identical batches, so the per-step camera checksum of the distributed render
    can stay off (the trainer compares it once, at the start of training)."""
    import hashlib

    from ..data.poses import CameraPoses

    poses = scene.camtoworlds.rows if isinstance(scene.camtoworlds, CameraPoses) else np.asarray(scene.camtoworlds)
    h = hashlib.blake2b(digest_size=8)
    for a in (poses, scene.Ks, scene.widths, scene.heights, train):
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    h.update(repr(sorted((k, v) for k, v in batcher_state.items() if k not in ("epoch", "step"))).encode())
    return int.from_bytes(h.digest(), "little") & (2**62 - 1)


def agree_cameras(scene: Scene, train: np.ndarray, batcher_state: dict, device: torch.device) -> None:
    """Every rank must draw the same batch cameras, and the trainer's renders do not compare
    them per step: one gather of `camera_digest` at the start of training. Ranks that differ
    raise the same ValueError on every rank, naming which ranks agree."""
    from ..distributed import gather_counts

    digests = gather_counts(camera_digest(scene, train, batcher_state), device)
    if len(set(digests)) > 1:
        groups: dict = {}
        for r, d in enumerate(digests):
            groups.setdefault(d, []).append(r)
        e = ValueError(f"the ranks loaded different cameras (ranks agreeing with each other: "
                       f"{sorted(groups.values())}): every rank must read the same scene (--data_dir, "
                       "--data_factor, --test_every) with the same --batch_size and --seed")
        e.agreed = True  # the same message on every rank (cli.main prints it once)
        raise e


def check_batch_size(n_train: int, world_size: int, batch_size: int) -> None:
    """ValueError naming the flags unless every rank can draw --batch_size distinct cameras
    of its own each step (the batcher's shards: n_train // world_size cameras each)."""
    if n_train >= world_size * batch_size:
        return
    fix = (f"pass --batch_size {n_train // world_size} or less, or run on fewer ranks" if n_train >= world_size
           else f"run on at most {n_train} ranks (--nproc_per_node) with --batch_size 1")
    raise ValueError(f"--batch_size {batch_size} on {world_size} rank(s) needs {world_size * batch_size} distinct "
                     f"training cameras per step, and the scene has {n_train} ({n_train // world_size} per rank): "
                     f"{fix}")
