"""Outputs in known coordinates (issue 32). The parsers normalise the scene on load
(data/normalize.py: `Scene.transform`, a similarity with normalized = T @ capture), so the
model trains, and is checkpointed, in the normalised world. This module says which world
each output is in, and can put the Gaussians back into the capture's own one:

- `cameras.json` (the 3DGS layout: id, img_name, width, height, position, rotation, fx, fy;
  camera-to-world in OpenCV axes) of the train cameras, then the test cameras, in the same
  coordinates as the PLY, so a viewer opens on a training view;
- `transform.json`: the 4x4 and its scale, its inverse, and which world the PLY and the
  cameras are in (the same dict goes into every checkpoint's meta as `state["frame"]`);
- `to_capture`: Gaussians from the normalised world to the capture's (means, log scales and
  rotations by the inverse similarity; SH coefficients rotated exactly, band by band).

Rank 0 writes the files; `to_capture` acts on a rank's own rows (the PLY is written in
chunks, each rank its own)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Sequence

import numpy as np
import torch
from torch import Tensor

from ...data import Scene
from ...data.normalize import transform_cameras
from .atomic import write_json

NORMALIZED, CAPTURE = "normalized", "capture"


def frame_info(transform: np.ndarray, ply_frame: str) -> Dict[str, Any]:
    """transform.json's content (and the checkpoint's `frame`): T [4, 4] with normalized =
    T @ capture (homogeneous columns), its scale and inverse, and the world of the PLY and
    cameras.json."""
    T = np.asarray(transform, dtype=np.float64)
    return {
        "normalized_from_capture": T.tolist(),
        "scale": float(np.linalg.norm(T[:3, 0])),  # a similarity: every column has the scale's norm
        "capture_from_normalized": np.linalg.inv(T).tolist(),
        "ply_frame": ply_frame,
        "cameras_frame": ply_frame,
        "about": "x_normalized = normalized_from_capture @ [x, y, z, 1] of the capture's world (COLMAP's sparse "
                 "model, or transforms.json's); the model trains and is checkpointed in the normalized world; "
                 "cameras.json: camera-to-world, OpenCV axes (x right, y down, z forward)",
    }


def cameras_json(scene: Scene, indices: Sequence[int], camtoworlds: np.ndarray) -> List[Dict[str, Any]]:
    """The 3DGS cameras.json entries of `indices`; camtoworlds [C_all, 4, 4] in the world
    the entries are written in. img_name: the image file's stem, as 3DGS writes it (no folder,
    no extension: `images/sub/0001.jpg` is `0001`)."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)  # [N]
    c2w = np.asarray(camtoworlds)[idx]  # [N, 4, 4]: gathered once, lists made in C (tolist)
    Ks = np.asarray(scene.Ks)[idx]  # [N, 3, 3]
    cols = (np.asarray(scene.widths)[idx].tolist(), np.asarray(scene.heights)[idx].tolist(),
            c2w[:, :3, 3].tolist(), c2w[:, :3, :3].tolist(), Ks[:, 1, 1].tolist(), Ks[:, 0, 0].tolist())
    names = scene.names
    return [{"id": i, "img_name": os.path.splitext(os.path.basename(names[c]))[0], "width": int(w), "height": int(h),
             "position": p, "rotation": r, "fy": float(fy), "fx": float(fx)}
            for i, (c, w, h, p, r, fy, fx) in enumerate(zip(idx.tolist(), *cols))]


CHUNK = 4096  # cameras encoded at once: a few ms of the GIL when written beside training


def _write_cameras(path: Path, scene: Scene, order: np.ndarray, c2w: np.ndarray) -> None:
    """cameras.json, one camera a line (3DGS writes it unindented), encoded chunk by chunk
    (bounded temporaries at a million cameras) into a temporary file renamed at the end:
    readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write("[")
        for a in range(0, len(order), CHUNK):
            entries = cameras_json(scene, order[a:a + CHUNK], c2w)
            for e in entries:
                e["id"] += a
            f.write(("\n" if a == 0 else ",\n") + ",\n".join(json.dumps(e) for e in entries))
        f.write("\n]\n")
    os.replace(tmp, path)


def write_frame_files(result_dir: Path, scene: Scene, ply_frame: str) -> Dict[str, Any]:
    """Rank 0: R/cameras.json (train cameras first, then test) and R/transform.json, in the
    world of the PLY (`ply_frame`); returns transform.json's dict."""
    info = write_transform(result_dir, scene, ply_frame)
    write_cameras(result_dir, scene, ply_frame)
    return info


def write_transform(result_dir: Path, scene: Scene, ply_frame: str) -> Dict[str, Any]:
    """Rank 0: R/transform.json (as the run starts: it is small); returns its dict."""
    info = frame_info(scene.transform, ply_frame)
    write_json(result_dir / "transform.json", info)
    return info


def write_cameras(result_dir: Path, scene: Scene, ply_frame: str) -> None:
    """Rank 0: R/cameras.json. The trainer writes it with the first PLY, which is what it
    serves: at a million cameras it is ~375 MB and ~15 s of one core, which the first steps
    would otherwise wait for (issue 35)."""
    c2w = np.asarray(scene.camtoworlds, dtype=np.float64)  # [C_all, 4, 4]
    if ply_frame == CAPTURE:
        c2w = transform_cameras(np.linalg.inv(np.asarray(scene.transform, dtype=np.float64)), c2w)
    order = np.concatenate([np.asarray(scene.train, dtype=np.int64), np.asarray(scene.test, dtype=np.int64)])
    result_dir.mkdir(parents=True, exist_ok=True)
    _write_cameras(result_dir / "cameras.json", scene, order, c2w)


# ---------------------------------------------------------------- Gaussians to the capture world

def matrix_to_quat(R: np.ndarray) -> np.ndarray:
    """[3, 3] rotation -> (w, x, y, z), unit, w >= 0 (Shepperd: the largest of the four
    candidates is taken as the pivot, so no division by a small number)."""
    m = np.asarray(R, dtype=np.float64)
    t = np.trace(m)
    cands = [t, m[0, 0], m[1, 1], m[2, 2]]
    k = int(np.argmax(cands))
    if k == 0:
        w = math.sqrt(1.0 + t) / 2
        q = [w, (m[2, 1] - m[1, 2]) / (4 * w), (m[0, 2] - m[2, 0]) / (4 * w), (m[1, 0] - m[0, 1]) / (4 * w)]
    else:
        i, j, l = k - 1, k % 3, (k + 1) % 3
        v = math.sqrt(1.0 + m[i, i] - m[j, j] - m[l, l]) / 2
        q = [0.0, 0.0, 0.0, 0.0]
        q[0] = (m[l, j] - m[j, l]) / (4 * v)
        q[1 + i] = v
        q[1 + j] = (m[j, i] + m[i, j]) / (4 * v)
        q[1 + l] = (m[l, i] + m[i, l]) / (4 * v)
    q = np.asarray(q)
    q /= np.linalg.norm(q)
    return q if q[0] >= 0 else -q


def quat_multiply(a: Tensor, b: Tensor) -> Tensor:
    """Hamilton product of (w, x, y, z) quaternions a [..., 4] and b [..., 4]: the rotation
    of b, then a."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack([
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    ], -1)


def sh_rotation(R: np.ndarray, degree: int, samples: int = 64) -> np.ndarray:
    """[K, K] float64 (K = (degree + 1)^2), X with Y(R d) = Y(d) X for every direction d,
    Y the [K] real SH bases the renderer evaluates (gsplat's, row vectors). Rotating the
    directions only mixes coefficients within a band, so each band's block is solved from
    the bases at `samples` directions by least squares; the system is exact, so the
    solution is too (to float64 rounding). Coefficients c [K] of f(d) = Y(d) c become
    X c for g(d) = f(R d)."""
    from ...gsplat_compat import sh_bases_torch

    K = (degree + 1) ** 2
    gen = np.random.default_rng(0)
    d = gen.normal(size=(max(samples, 2 * K), 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    Rd = d @ np.asarray(R, dtype=np.float64).T
    A = sh_bases_torch(K, torch.from_numpy(d)).numpy()  # [S, K]
    B = sh_bases_torch(K, torch.from_numpy(Rd)).numpy()  # [S, K]
    X = np.zeros((K, K))
    for band in range(degree + 1):
        s = slice(band * band, (band + 1) ** 2)
        X[s, s] = np.linalg.lstsq(A[:, s], B[:, s], rcond=None)[0]
    return X


def to_capture(params: Dict[str, Tensor], transform: np.ndarray) -> Dict[str, Tensor]:
    """Gaussians (raw parameters: means [N, 3], log scales [N, 3], quats [N, 4], opacities
    [N], sh0 [N, 1, 3], shN [N, K-1, 3]) from the normalised world into the capture's,
    x_capture = T^-1 x_normalized for T = s R | t. Opacities are unchanged; the colour seen
    from capture direction d is the trained colour from R d, so the SH coefficients rotate."""
    T = np.asarray(transform, dtype=np.float64)
    s = float(np.linalg.norm(T[:3, 0]))
    R, t = T[:3, :3] / s, T[:3, 3]
    means = params["means"].detach()
    dev, dt = means.device, means.dtype
    Rt = torch.as_tensor(R, dtype=torch.float64, device=dev)
    out = dict(params)
    out["means"] = (((means.double() - torch.as_tensor(t, device=dev)) @ Rt) / s).to(dt)  # R^T (x - t) / s
    out["scales"] = params["scales"].detach() - math.log(s)
    q_inv = torch.as_tensor(matrix_to_quat(R.T), dtype=torch.float64, device=dev)  # [4]
    out["quats"] = quat_multiply(q_inv.expand(len(means), 4), params["quats"].detach().double()).to(dt)
    k_rest = params["shN"].shape[1]
    if k_rest:
        degree = int(round(math.sqrt(k_rest + 1))) - 1
        X = torch.as_tensor(sh_rotation(R, degree), device=dev)  # [K, K]
        sh = torch.cat([params["sh0"].detach(), params["shN"].detach()], 1).double()  # [N, K, 3]
        rotated = torch.einsum("jk,nkc->njc", X, sh).to(params["shN"].dtype)
        out["sh0"], out["shN"] = rotated[:, :1].contiguous(), rotated[:, 1:].contiguous()
    return out
