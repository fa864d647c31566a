"""Small generated datasets on disk for the data tests: a COLMAP capture of the synthetic
scene (JPEGs + binary model) that tests may break on purpose, and a plain Pillow decode,
the independent reference every cache mode must match byte for byte."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
from PIL import Image

from distsplat.data import colmap_io
from distsplat.data.synthetic import make_synthetic_scene, splat_points


def rotmat_to_qvec(R: np.ndarray) -> np.ndarray:
    """[3, 3] rotation -> (w, x, y, z), for writing COLMAP models: the inverse of
    colmap_io.qvec_to_rotmat (COLMAP's rotmat2qvec, whose `Ryx` is R[0, 1])."""
    R = R.T
    K = np.array([
        [R[0, 0] - R[1, 1] - R[2, 2], 0, 0, 0],
        [R[1, 0] + R[0, 1], R[1, 1] - R[0, 0] - R[2, 2], 0, 0],
        [R[2, 0] + R[0, 2], R[2, 1] + R[1, 2], R[2, 2] - R[0, 0] - R[1, 1], 0],
        [R[1, 2] - R[2, 1], R[2, 0] - R[0, 2], R[0, 1] - R[1, 0], R[0, 0] + R[1, 1] + R[2, 2]],
    ]) / 3.0
    vals, vecs = np.linalg.eigh(K)
    q = vecs[[3, 0, 1, 2], np.argmax(vals)]
    return -q if q[0] < 0 else q


def scene_to_model(scene, model: str = "PINHOLE", params: Optional[np.ndarray] = None) -> colmap_io.Model:
    K = scene.Ks[0]
    w, h = int(scene.widths[0]), int(scene.heights[0])
    if params is None:
        params = np.array([K[0, 0], K[1, 1], K[0, 2], K[1, 2]])
    cameras = {1: colmap_io.Camera(1, model, w, h, np.asarray(params, dtype=np.float64))}
    images = {}
    for i, name in enumerate(scene.names):
        w2c = np.linalg.inv(scene.camtoworlds[i])
        images[i + 1] = colmap_io.Image(i + 1, rotmat_to_qvec(w2c[:3, :3]), w2c[:3, 3], 1, name + ".jpg")
    n = len(scene.points)
    points = colmap_io.Points(np.arange(1, n + 1), scene.points.astype(np.float64), scene.points_rgb, np.full(n, 0.5))
    return colmap_io.Model(cameras, images, points)


def make_colmap_dataset(root: Path, num_cameras: int = 10, width: int = 64, height: int = 48,
                        factors: Tuple[int, ...] = (2,), quality: int = 90) -> Path:
    """root/{sparse/0/*.bin, images/*.jpg, images_N/*.jpg} of a synthetic scene."""
    scene = make_synthetic_scene(num_cameras=num_cameras, num_gaussians=300, width=width, height=height)
    colmap_io.write_model_bin(scene_to_model(scene), root / "sparse" / "0")
    (root / "images").mkdir(parents=True)
    for i, name in enumerate(scene.names):
        img = Image.fromarray(splat_points(scene, i))
        img.save(root / "images" / f"{name}.jpg", quality=quality)
        for f in factors:
            (root / f"images_{f}").mkdir(exist_ok=True)
            img.resize((round(width / f), round(height / f)), Image.LANCZOS).save(root / f"images_{f}" / f"{name}.jpg", quality=quality)
    return root


def pillow_decode(path, size: Optional[Tuple[int, int]] = None, background=None) -> np.ndarray:
    """The reference: Pillow, as a user would write it (draft + bicubic when downscaling)."""
    im = Image.open(path)
    if size is not None and im.size != size:
        im.draft("RGB", size)
    if background is not None and im.mode == "RGBA":
        im = Image.alpha_composite(Image.new("RGBA", im.size, (*background, 255)), im)
    im = im.convert("RGB")
    if size is not None and im.size != size:
        im = im.resize(size, Image.BICUBIC)
    return np.asarray(im)


def global_batches(num_cameras: int, batch_size: int, steps: int, seed: int = 0):
    """Stand-in for the distributed batcher: each epoch a shared-seed permutation of the
    cameras, cut into batches; the same on every rank."""
    out, epoch = [], 0
    while len(out) < steps:
        perm = np.random.default_rng(seed + epoch).permutation(num_cameras)
        out += [perm[i:i + batch_size].tolist() for i in range(0, num_cameras - batch_size + 1, batch_size)]
        epoch += 1
    return out[:steps]


def owners(num_cameras: int, world: int, seed: int = 0) -> np.ndarray:
    """[C] rank owning each camera: a shared-seed permutation dealt round robin."""
    perm = np.random.default_rng(10_000 + seed).permutation(num_cameras)
    own = np.empty(num_cameras, np.int64)
    own[perm] = np.arange(num_cameras) % world
    return own


class CountingSource:
    """Wraps an ImageSource and counts reads per camera (to see I/O)."""

    def __init__(self, source):
        self.source, self.reads = source, {}
        self.names = source.names

    def __len__(self):
        return len(self.source)

    def read(self, i):
        self.reads[i] = self.reads.get(i, 0) + 1
        return self.source.read(i)

    def __getattr__(self, name):
        return getattr(self.source, name)


# ------------------------------------------------------------------ distorted captures
# Images of the synthetic scene's Gaussians as a distorted camera sees them: rendered by a
# pinhole camera of the same focal length on a canvas that covers every distorted pixel's
# ray, then sampled through pycolmap's camera model (the independent reference of what a
# COLMAP camera sees), so undistorting them must give back the pinhole view.

def render_view(scene, index: int, K: np.ndarray, width: int, height: int) -> np.ndarray:
    """[H, W, 3] float32 in [0, 1]: the scene's ground-truth Gaussians seen by camera
    `index`'s pose with intrinsics K (torch backend)."""
    import torch

    from distsplat.render import rasterize

    g = {k: torch.from_numpy(v) for k, v in scene.gaussians.items()}
    viewmat = torch.from_numpy(np.linalg.inv(scene.camtoworlds[index])).float()[None]
    with torch.no_grad():
        colors, _, _ = rasterize(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"], viewmat,
                                 torch.from_numpy(K).float()[None], width, height, backend="torch")
    return colors[0].clamp(0, 1).numpy()


def distorted_view(scene, index: int, model: str, params, width: int, height: int) -> np.ndarray:
    """[height, width, 3] uint8: camera `index` seen through COLMAP camera (model, params)."""
    import pycolmap
    import torch

    cam = pycolmap.Camera(model=model, width=width, height=height, params=np.asarray(params, dtype=np.float64))
    gy, gx = np.mgrid[0:height, 0:width] + 0.5
    rays = cam.cam_from_img(np.stack([gx.ravel(), gy.ravel()], 1))  # [H*W, 2] (x/z, y/z), pixel centres at +0.5
    f = float(params[0])
    lo, hi = rays.min(0) * f - 2, rays.max(0) * f + 2  # the canvas, in pixels around the optical axis
    cw, ch = int(np.ceil(hi[0] - lo[0])), int(np.ceil(hi[1] - lo[1]))
    K = np.array([[f, 0, -lo[0]], [0, f, -lo[1]], [0, 0, 1.0]])
    canvas = torch.from_numpy(render_view(scene, index, K, cw, ch)).permute(2, 0, 1)[None]  # [1, 3, ch, cw]
    px = rays * f - lo  # [H*W, 2] canvas coordinates (pixel centres at +0.5)
    grid = torch.from_numpy(np.stack([2 * px[:, 0] / cw - 1, 2 * px[:, 1] / ch - 1], 1)).float().view(1, height, width, 2)
    out = torch.nn.functional.grid_sample(canvas, grid, mode="bilinear", align_corners=False)[0].permute(1, 2, 0)
    return (out.numpy() * 255).round().astype(np.uint8)


def make_distorted_colmap(root: Path, cameras, num_cameras: int = 16, num_gaussians: int = 400, seed: int = 0) -> Path:
    """root/{sparse/0/*.bin, images/*.png}: the synthetic scene through COLMAP cameras;
    `cameras` is [(model, params, width, height)], dealt to the images round robin."""
    scene = make_synthetic_scene(num_cameras=num_cameras, num_gaussians=num_gaussians, seed=seed)
    model = scene_to_model(scene)
    model.cameras = {j + 1: colmap_io.Camera(j + 1, m, w, h, np.asarray(p, dtype=np.float64))
                     for j, (m, p, w, h) in enumerate(cameras)}
    (root / "images").mkdir(parents=True)
    for i, name in enumerate(scene.names):
        cid = i % len(cameras) + 1
        m, p, w, h = cameras[cid - 1]
        im = model.images[i + 1]
        model.images[i + 1] = colmap_io.Image(im.id, im.qvec, im.tvec, cid, name + ".png")
        Image.fromarray(distorted_view(scene, i, m, p, w, h)).save(root / "images" / f"{name}.png")
    colmap_io.write_model_bin(model, root / "sparse" / "0")
    return root


def colmap_to_nerfstudio(colmap_root: Path, out: Path, per_frame: bool = False) -> Path:
    """What `ns-process-data` writes for a COLMAP capture (nerfstudio's colmap_to_json and
    create_ply_from_colmap): OpenGL camera-to-world poses in a world with y and z swapped
    and z negated (`applied_transform`), intrinsics and OPENCV / OPENCV_FISHEYE
    coefficients (globally, or per frame), sparse_pc.ply in the same world, images/."""
    import shutil

    model = colmap_io.read_model(colmap_root / "sparse" / "0")
    applied = np.eye(4)[:3][[0, 2, 1]]
    applied[2] *= -1

    def params(cam):
        p = cam.params
        if cam.model == "OPENCV_FISHEYE":
            return {"camera_model": "OPENCV_FISHEYE", "fl_x": p[0], "fl_y": p[1], "cx": p[2], "cy": p[3],
                    "k1": p[4], "k2": p[5], "k3": p[6], "k4": p[7], "w": cam.width, "h": cam.height}
        if cam.model == "SIMPLE_RADIAL":
            return {"camera_model": "OPENCV", "fl_x": p[0], "fl_y": p[0], "cx": p[1], "cy": p[2], "k1": p[3],
                    "k2": 0.0, "p1": 0.0, "p2": 0.0, "w": cam.width, "h": cam.height}
        if cam.model == "PINHOLE":
            return {"camera_model": "PINHOLE", "fl_x": p[0], "fl_y": p[1], "cx": p[2], "cy": p[3],
                    "w": cam.width, "h": cam.height}
        assert cam.model == "OPENCV", cam.model
        return {"camera_model": "OPENCV", "fl_x": p[0], "fl_y": p[1], "cx": p[2], "cy": p[3], "k1": p[4],
                "k2": p[5], "p1": p[6], "p2": p[7], "w": cam.width, "h": cam.height}

    frames = []
    for im in model.images.values():
        w2c = np.eye(4)
        w2c[:3, :3], w2c[:3, 3] = colmap_io.qvec_to_rotmat(im.qvec), im.tvec
        c2w = np.linalg.inv(w2c)
        c2w[0:3, 1:3] *= -1
        c2w = c2w[[0, 2, 1, 3]]
        c2w[2] *= -1
        frame = {"file_path": f"images/{im.name}", "transform_matrix": c2w.tolist(), "colmap_im_id": im.id}
        if per_frame:
            frame.update({k: float(v) if not isinstance(v, str) else v for k, v in params(model.cameras[im.camera_id]).items()})
        frames.append(frame)
    meta = {} if per_frame else {k: float(v) if not isinstance(v, str) else v for k, v in params(model.cameras[1]).items()}
    meta.update({"frames": frames, "applied_transform": applied.tolist(), "ply_file_path": "sparse_pc.ply"})
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(colmap_root / "images", out / "images")
    xyz = model.points.xyz @ applied[:, :3].T + applied[:, 3]
    with open(out / "sparse_pc.ply", "w") as f:
        f.write(f"ply\nformat ascii 1.0\nelement vertex {len(xyz)}\nproperty float x\nproperty float y\n"
                "property float z\nproperty uint8 red\nproperty uint8 green\nproperty uint8 blue\nend_header\n")
        for (x, y, z), (r, g, b) in zip(xyz, model.points.rgb):
            f.write(f"{x:8f} {y:8f} {z:8f} {r} {g} {b}\n")
    (out / "transforms.json").write_text(json.dumps(meta, indent=2))
    return out


def make_mixed_size_colmap(root: Path, sizes=((40, 30), (24, 32)), num_cameras: int = 12, num_gaussians: int = 300,
                           seed: int = 0) -> Path:
    """root/{sparse/0/*.bin, images/*.png}: the synthetic scene through PINHOLE cameras of
    different sizes (and aspects), one COLMAP camera per size dealt round robin, each with
    the same field of view across its larger side; the images are the scene's exact renders
    (no resampling, lossless PNG), so a training can match them."""
    scene = make_synthetic_scene(num_cameras=num_cameras, num_gaussians=num_gaussians, seed=seed)
    model = scene_to_model(scene)
    f0 = scene.Ks[0][0, 0] / max(scene.widths[0], scene.heights[0])  # focal per pixel of the larger side
    model.cameras = {}
    for j, (w, h) in enumerate(sizes):
        f = f0 * max(w, h)
        model.cameras[j + 1] = colmap_io.Camera(j + 1, "PINHOLE", w, h, np.array([f, f, w / 2, h / 2]))
    (root / "images").mkdir(parents=True)
    for i, name in enumerate(scene.names):
        cid = i % len(sizes) + 1
        cam = model.cameras[cid]
        im = model.images[i + 1]
        model.images[i + 1] = colmap_io.Image(im.id, im.qvec, im.tvec, cid, name + ".png")
        K = np.array([[cam.params[0], 0, cam.params[2]], [0, cam.params[1], cam.params[3]], [0, 0, 1.0]])
        Image.fromarray((render_view(scene, i, K, cam.width, cam.height) * 255).round().astype(np.uint8)).save(root / "images" / f"{name}.png")
    colmap_io.write_model_bin(model, root / "sparse" / "0")
    return root


# ------------------------------------------------------------------ captures as users find them (issue 34)

GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])


def make_instant_ngp(root: Path, num_cameras: int = 12, width: int = 64, height: int = 48,
                     missing: Tuple[int, ...] = (), k1: float = 0.0, per_frame: bool = False, with_size: bool = True,
                     ext: str = ".jpg", folder: str = "images") -> Path:
    """root/{transforms.json, images/NNNN.jpg}: what instant-ngp's colmap2nerf.py writes
    (camera_angle_x/y, fl_x/fl_y, cx/cy, k1 k2 p1 p2, w/h, aabb_scale; no camera_model, no
    points file, no split lists; frames in file order with './' paths and a sharpness), for
    the synthetic scene; the frames at `missing` are listed but their image is not written
    (as a repository that removed some images and kept the json). `per_frame`: the
    intrinsics in each frame instead of the file; `with_size=False`: no w/h (read from the
    images)."""
    scene = make_synthetic_scene(num_cameras=num_cameras, num_gaussians=300, width=width, height=height)
    K = scene.Ks[0]
    fx, fy, cx, cy = float(K[0, 0]), float(K[1, 1]), float(K[0, 2]), float(K[1, 2])
    cam = {"camera_angle_x": 2 * np.arctan(width / (2 * fx)), "camera_angle_y": 2 * np.arctan(height / (2 * fy)),
           "fl_x": fx, "fl_y": fy, "k1": k1, "k2": 0.0, "p1": 0.0, "p2": 0.0, "cx": cx, "cy": cy}
    if with_size:
        cam.update(w=width, h=height)
    (root / folder).mkdir(parents=True, exist_ok=True)
    frames = []
    for i in range(num_cameras):
        name = f"{folder}/{i:04d}{ext}"
        frame = {"file_path": f"./{name}", "sharpness": 50.0 + i, "transform_matrix": (scene.camtoworlds[i] @ GL_TO_CV).tolist()}
        if per_frame:
            frame.update(cam)
        frames.append(frame)
        if i not in missing:
            Image.fromarray(splat_points(scene, i)).save(root / name, quality=95)
    meta = ({} if per_frame else dict(cam)) | {"aabb_scale": 16, "frames": frames}
    (root / "transforms.json").write_text(json.dumps(meta, indent=2))
    return root


def make_two_camera_capture(root: Path, num_cameras: int = 12, model_dir: str = "colmap_sparse/0") -> Path:
    """The issue-34 layout of a two-camera COLMAP capture: PNGs in per-camera subfolders
    images/cam_a/, images/cam_b/ (two PINHOLE cameras of different sizes), the model (with
    its points) in `model_dir` instead of sparse/0, and beside it a colmap2nerf-style
    instant-ngp transforms.json of the same frames (no points)."""
    scene = make_synthetic_scene(num_cameras=num_cameras, num_gaussians=300, width=64, height=48)
    model = scene_to_model(scene)
    sizes = {1: ("cam_a", 64, 48), 2: ("cam_b", 48, 40)}
    f0 = scene.Ks[0][0, 0] / 64
    model.cameras = {cid: colmap_io.Camera(cid, "PINHOLE", w, h, np.array([f0 * w, f0 * w, w / 2, h / 2]))
                     for cid, (_, w, h) in sizes.items()}
    frames = []
    for i in range(num_cameras):
        cid = i % 2 + 1
        sub, w, h = sizes[cid]
        name = f"{sub}/{i:03d}.png"
        im = model.images[i + 1]
        model.images[i + 1] = colmap_io.Image(im.id, im.qvec, im.tvec, cid, name)
        (root / "images" / sub).mkdir(parents=True, exist_ok=True)
        view = make_view(scene, i, model.cameras[cid])
        Image.fromarray(view).save(root / "images" / name)
        frames.append({"file_path": f"images/{name}", "transform_matrix": (scene.camtoworlds[i] @ GL_TO_CV).tolist(),
                       "fl_x": f0 * w, "fl_y": f0 * w, "cx": w / 2, "cy": h / 2, "w": w, "h": h})
    colmap_io.write_model_bin(model, root / model_dir)
    (root / "transforms.json").write_text(json.dumps({"aabb_scale": 4, "frames": frames}, indent=1))
    return root


def make_view(scene, index: int, cam) -> np.ndarray:
    """[h, w, 3] uint8 of the scene's points seen by camera `index`'s pose through PINHOLE `cam`."""
    from distsplat.data.scene import Scene

    fx, fy, cx, cy = cam.params
    one = Scene(names=["v"], camtoworlds=scene.camtoworlds[index][None],
                Ks=np.array([[[fx, 0, cx], [0, fy, cy], [0, 0, 1.0]]]), widths=np.array([cam.width]),
                heights=np.array([cam.height]), points=scene.points, points_rgb=scene.points_rgb,
                train=np.array([0]), test=np.array([], np.int64), images=None)
    return splat_points(one, 0)
