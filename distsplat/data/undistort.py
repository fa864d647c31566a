"""Undistortion of distorted cameras to pinhole ones, as gsplat's COLMAP parser does it: the
renderer (both backends) knows pinhole cameras only, so a camera with lens distortion is
replaced, when the scene is parsed, by a pinhole camera whose image is a remap of the stored
one, cropped to the region where every pixel comes from inside the stored image.

Two halves, split by cost (docs/design.md: every rank holds all cameras, only the owner reads
an image):
- `plan_undistortion` (every rank, every camera, at parse time): the new pinhole K and
  size. Analytic on a few border points; no pixel work.
- `Undistortion.__call__` (only the rank that owns an image, in decode.py, when the image
  is decoded): the remap. Its maps are computed on first use, once per camera (all images
  of one COLMAP camera share one `Undistortion`), so a rank that owns no image of a camera
  never computes them. With the `decoded` and `gpu` caches (auto's first choice) an image
  is decoded, hence undistorted, once; the `compressed` and `none` caches decode on every
  use, and the remap comes with each decode (1280x720: remap 15 ms, JPEG decode 56 ms, on
  a loaded 2-core machine).

Models (COLMAP's names; OpenCV's distortion coefficients):
- perspective: SIMPLE_RADIAL [k,0,0,0], RADIAL [k1,k2,0,0], OPENCV [k1,k2,p1,p2],
  FULL_OPENCV [k1,k2,p1,p2,k3,k4,k5,k6]. New K: `cv2.getOptimalNewCameraMatrix(alpha=0)`,
  then crop to its valid ROI (gsplat's choice: same K and size as gsplat gives).
- fisheye (equidistant + polynomial in theta): OPENCV_FISHEYE [k1..k4], and COLMAP's
  SIMPLE_RADIAL_FISHEYE [k,0,0,0] and RADIAL_FISHEYE [k1,k2,0,0], which are the same
  polynomial. New K: the same focal length (the centre keeps its resolution), cropped to
  the largest axis-aligned rectangle inside the undistorted image border, at most the
  stored size around the principal point (a pinhole view of a wide fisheye grows without
  bound towards 90 degrees, at ever lower resolution). gsplat's parser instead remaps with
  r = theta, which is not a pinhole image; we undistort exactly, with cv2.fisheye.

Pixel convention: COLMAP's and the renderer's pixel (i, j) is centred at (i + 0.5, j + 0.5);
OpenCV's at (i, j). K is shifted by half a pixel into OpenCV's convention and back, so the
distortion centre is exact (gsplat skips this; it moves fisheye pixels by up to ~0.1 px).

Why OpenCV (opencv-python-headless) and not a torch `grid_sample` remap: the optimal new
camera matrix, the fisheye model and its inverse are OpenCV's, well kept and identical to
what gsplat computes (comparable results on the same capture); a torch remap would reimplement
the inverse distortion and the ROI search. The cost is a 58 MiB wheel (152 MiB installed,
torch is 716 MiB), measured in pyproject.toml's comment. cv2 is imported only when a scene
has a distorted camera.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .errors import DataError

log = logging.getLogger(__name__)

PERSPECTIVE = ("SIMPLE_RADIAL", "RADIAL", "OPENCV", "FULL_OPENCV")
FISHEYE = ("OPENCV_FISHEYE", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE")
PINHOLE = ("SIMPLE_PINHOLE", "PINHOLE")
SUPPORTED = PINHOLE + PERSPECTIVE + FISHEYE


def split_params(model: str, params: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """COLMAP camera params -> ([3, 3] K at the camera's size, OpenCV distortion coefficients).
    The caller has checked that `model` is in SUPPORTED and the params count (colmap_io)."""
    p = np.asarray(params, dtype=np.float64)
    if model in ("SIMPLE_PINHOLE", "SIMPLE_RADIAL", "RADIAL", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE"):
        fx = fy = p[0]
        cx, cy, rest = p[1], p[2], p[3:]
    else:
        fx, fy, cx, cy, rest = p[0], p[1], p[2], p[3], p[4:]
    K = np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
    n = {"SIMPLE_PINHOLE": 0, "PINHOLE": 0, "FULL_OPENCV": 8}.get(model, 4)
    dist = np.zeros(n)
    dist[: len(rest)] = rest  # SIMPLE_RADIAL [k] -> [k, 0, 0, 0] (OpenCV: k1, k2, p1, p2)
    return K, dist


def _cv2():
    try:
        import cv2
    except ImportError:
        raise DataError("the scene has distorted cameras, which need OpenCV to undistort: "
                        "pip install opencv-python-headless") from None
    return cv2


def _to_cv(K: np.ndarray) -> np.ndarray:
    """K in COLMAP's pixel convention (centres at +0.5) -> OpenCV's (centres at integers)."""
    K = K.copy()
    K[0, 2] -= 0.5
    K[1, 2] -= 0.5
    return K


def _from_cv(K: np.ndarray) -> np.ndarray:
    K = K.copy()
    K[0, 2] += 0.5
    K[1, 2] += 0.5
    return K


@dataclass(eq=False)
class Undistortion:
    """One camera's distorted image (`in_size`, K, dist) -> pinhole image (`size`, K_new).
    Shared by all images of the camera; safe to call from several decode threads."""

    camera: str  # what messages name, e.g. "cameras.bin camera 1 (OPENCV)"
    fisheye: bool
    K: np.ndarray  # [3, 3] distorted camera at in_size, COLMAP pixel convention
    dist: np.ndarray  # [4] or [8] OpenCV distortion coefficients
    in_size: Tuple[int, int]  # (w, h) of the decoded distorted image
    K_new: np.ndarray  # [3, 3] the pinhole camera of the output, COLMAP pixel convention
    size: Tuple[int, int]  # (W, H) of the output
    _maps: Optional[Tuple[np.ndarray, np.ndarray]] = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def maps(self) -> Tuple[np.ndarray, np.ndarray]:
        """([H, W] x, [H, W] y) float32: where each output pixel samples the input, OpenCV
        convention (computed anew; the remap keeps its fixed-point form)."""
        cv2 = _cv2()
        K, K_new = _to_cv(self.K), _to_cv(self.K_new)
        if self.fisheye:
            return cv2.fisheye.initUndistortRectifyMap(K, self.dist, np.eye(3), K_new, self.size, cv2.CV_32FC1)
        return cv2.initUndistortRectifyMap(K, self.dist, None, K_new, self.size, cv2.CV_32FC1)

    def _remap_maps(self) -> Tuple[np.ndarray, np.ndarray]:
        """The maps in OpenCV's fixed-point form ([H, W, 2] int16 + [H, W] uint16 at 1/32 px,
        what remap computes with anyway: half the time of float maps on 1280x720, 15 vs 32 ms).
        Computed once, on the first image of this camera this rank decodes."""
        with self._lock:
            if self._maps is None:
                cv2 = _cv2()
                self._maps = cv2.convertMaps(*self.maps(), cv2.CV_16SC2)
                log.debug("%s: undistortion maps %dx%d computed", self.camera, *self.size)
            return self._maps

    def __call__(self, image: np.ndarray, where: str = "") -> np.ndarray:
        """[h, w, 3] uint8 distorted image -> [H, W, 3] uint8 pinhole image (bilinear)."""
        if image.shape[:2] != (self.in_size[1], self.in_size[0]):
            raise DataError(f"{where}: image is {image.shape[1]}x{image.shape[0]}, its camera {self.camera} "
                            f"is undistorted from {self.in_size[0]}x{self.in_size[1]}")
        cv2 = _cv2()
        m1, m2 = self._remap_maps()
        # Replicate, not black: the ROI's border samples may fall a fraction of a pixel
        # outside the outermost pixel centres.
        return cv2.remap(image, m1, m2, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def plan_undistortion(model: str, params: np.ndarray, K: np.ndarray, in_size: Tuple[int, int],
                      camera: str) -> Optional[Undistortion]:
    """The pinhole camera that replaces a distorted one whose images are loaded at
    `in_size` with intrinsics K (already scaled to that size); None when the model has no
    distortion or a perspective model's coefficients are all zero (nothing to do: the image
    is used as is). A fisheye is never a pinhole, even with zero coefficients (equidistant)."""
    _, dist = split_params(model, params)
    if model in PINHOLE or (model in PERSPECTIVE and not np.any(dist != 0)):
        return None
    if not np.all(np.isfinite(dist)):
        raise DataError(f"{camera}: distortion coefficients {dist.tolist()} are not finite; the reconstruction is damaged")
    cv2 = _cv2()
    w, h = in_size
    fisheye = model in FISHEYE
    K_cv = _to_cv(K)
    if fisheye:
        K_new_cv, size = _fisheye_pinhole(cv2, K_cv, dist, w, h, camera)
    else:
        K_opt, (x, y, rw, rh) = cv2.getOptimalNewCameraMatrix(K_cv, dist, (w, h), 0)
        if rw <= 0 or rh <= 0:
            raise DataError(f"{camera}: distortion {dist.tolist()} leaves no valid pinhole region; "
                            "check the camera's parameters or undistort with colmap image_undistorter")
        K_new_cv = K_opt.copy()
        K_new_cv[0, 2] -= x
        K_new_cv[1, 2] -= y
        size = (int(rw), int(rh))
    return Undistortion(camera, fisheye, K.copy(), dist, (int(w), int(h)), _from_cv(K_new_cv), size)


def _fisheye_pinhole(cv2, K: np.ndarray, dist: np.ndarray, w: int, h: int, camera: str):
    """(K_new, (W, H)), OpenCV convention: same focal, cropped to the largest axis-aligned
    rectangle inside the undistorted border of the pixel centres, at most w x h around the
    principal point."""
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    n = 64
    xs, ys = np.linspace(0, w - 1, n), np.linspace(0, h - 1, n)
    edges = {"left": np.stack([np.zeros(n), ys], 1), "right": np.stack([np.full(n, w - 1.0), ys], 1),
             "top": np.stack([xs, np.zeros(n)], 1), "bottom": np.stack([xs, np.full(n, h - 1.0)], 1)}
    # theta_d(theta) must rise up to the largest radius in the image, else some pixels
    # have two rays (or a ray's neighbours fold back): no pinhole image exists.
    r_max = max(np.hypot((e[:, 0] - cx) / fx, (e[:, 1] - cy) / fy).max() for e in edges.values())
    theta = np.linspace(0, math.pi / 2, 4001)[:-1]
    t2 = theta ** 2
    theta_d = theta * (1 + t2 * (dist[0] + t2 * (dist[1] + t2 * (dist[2] + t2 * dist[3]))))
    reach = int(np.argmax(theta_d >= r_max)) if (theta_d >= r_max).any() else len(theta) - 1
    if np.any(np.diff(theta_d[: reach + 1]) <= 0):
        raise DataError(f"{camera}: fisheye distortion {dist.tolist()} is not monotonic within the image "
                        "(two viewing angles map to one radius); check the camera's parameters")
    P = np.array([[fx, 0.0, 0.0], [0.0, fy, 0.0], [0.0, 0.0, 1.0]])  # pixels relative to the principal point
    left, right, top, bottom = -cx, w - 1 - cx, -cy, h - 1 - cy  # at most the stored size
    for name, pts in edges.items():
        und = cv2.fisheye.undistortPoints(pts[:, None, :], K, dist, P=P)[:, 0]  # [n, 2]
        # Border pixels at 90 degrees or more have no pinhole position (they bound nothing):
        # keep the points that project back onto themselves.
        back = cv2.fisheye.distortPoints((und / [fx, fy])[:, None, :], K, dist)[:, 0]
        ok = np.isfinite(und).all(1) & (np.abs(back - pts) < 1e-3).all(1)
        if ok.any():
            if name == "left":
                left = max(left, und[ok, 0].max())
            elif name == "right":
                right = min(right, und[ok, 0].min())
            elif name == "top":
                top = max(top, und[ok, 1].max())
            else:
                bottom = min(bottom, und[ok, 1].min())
    x0, y0 = math.ceil(left - 1e-9), math.ceil(top - 1e-9)
    W, H = math.floor(right + 1e-9) - x0 + 1, math.floor(bottom + 1e-9) - y0 + 1
    if W < 2 or H < 2:
        raise DataError(f"{camera}: distortion {dist.tolist()} leaves no valid pinhole region")
    K_new = np.array([[fx, 0.0, -x0], [0.0, fy, -y0], [0.0, 0.0, 1.0]])
    # The rectangle's corners must map inside the stored image (a border that is not convex
    # in the way a barrel-distorted one is would fail here rather than show black corners).
    corners = np.array([[0, 0], [W - 1, 0], [0, H - 1], [W - 1, H - 1]], dtype=np.float64)
    rays = np.stack([(corners[:, 0] + x0) / fx, (corners[:, 1] + y0) / fy], 1)  # [4, 2] normalised
    px = cv2.fisheye.distortPoints(rays[:, None, :], K, dist)[:, 0]
    if not (np.all(px > -0.5) and np.all(px[:, 0] < w - 0.5) and np.all(px[:, 1] < h - 0.5)):
        raise DataError(f"{camera}: could not find a valid pinhole crop for distortion {dist.tolist()}")
    return K_new, (int(W), int(H))


def undistort_cameras(cams: Sequence, Ks: np.ndarray, sizes: np.ndarray,
                      label: Callable[[object], str]) -> Optional[List[Optional[Undistortion]]]:
    """Plans the undistortion of each image's camera (`cams[i]`: .id, .model, .params; one
    plan per camera and loaded size, shared by its images) and writes the pinhole K
    [C, 3, 3] and size [C, 2] (w, h) in place. Returns the per-image plans, or None when
    no camera is distorted. `label(cam)` names the camera in messages."""
    plans: Dict[tuple, Optional[Undistortion]] = {}
    per_image: List[Optional[Undistortion]] = []
    for i, cam in enumerate(cams):
        key = (cam.id, int(sizes[i, 0]), int(sizes[i, 1]))
        if key not in plans:
            plans[key] = plan_undistortion(cam.model, cam.params, Ks[i], (key[1], key[2]), label(cam))
        u = plans[key]
        per_image.append(u)
        if u is not None:
            Ks[i], sizes[i] = u.K_new, u.size
    if not any(u is not None for u in per_image):
        return None
    done = [u for u in plans.values() if u is not None]
    log.info("undistorting on load, each rank its own images: %s",
             "; ".join(f"{u.camera}: {u.in_size[0]}x{u.in_size[1]} -> pinhole {u.size[0]}x{u.size[1]}" for u in done))
    return per_image
