"""Undistortion against an independent reference: pycolmap's camera models (COLMAP's own
projection code) put known 3D points into a distorted image; the undistorted image must
show them where the new pinhole K projects them, to a tenth of a pixel.

The distorted image is what pycolmap's model says the camera sees: each of its pixel
centres (at +0.5, COLMAP's and the renderer's convention) is turned into a ray by pycolmap
(`cam_from_img`), and the scene is a set of Gaussian dots (sigma 1.2 px in the pinhole
image, peak 250) around the directions of known 3D points. The ideal undistorted image is
then these dots, centred where K_new projects the points; the intensity centroid of each
dot in our undistorted image is compared with that. (Dots drawn round in the distorted
image would not do: a warp that stretches the periphery moves a blob's centroid by
~1.5 g'' sigma^2, 0.1 px at a fisheye's edge.) The points' distorted positions come from
pycolmap's forward projection (`img_from_cam`), which must agree with its inverse.
Error budget, well under 0.1 px: OpenCV's remap samples at 1/32 px (<= 1/64 px position
error), bilinear resampling of a sigma-1.2 Gaussian biases a centroid by ~0.01 px, uint8
rounding (<= 0.5 per pixel over a ~2300 summed intensity) by < 0.01 px. A half-pixel
convention slip, a wrong coefficient order or the wrong fisheye polynomial each move dots
by 0.3 px or more.
"""

from __future__ import annotations

import numpy as np
import pycolmap
import pytest

from distsplat.data import DataError
from distsplat.data.undistort import plan_undistortion, split_params

W, H = 160, 120
SIGMA, PEAK, HALF = 1.2, 250.0, 5  # dot size, brightness, centroid window half-size (> 4 sigma)

MODELS = {
    "SIMPLE_RADIAL": [110.0, 81.0, 58.5, -0.08],
    "RADIAL": [110.0, 79.3, 61.0, -0.1, 0.03],
    "OPENCV": [112.0, 108.0, 80.7, 59.2, -0.12, 0.04, 0.002, -0.003],
    "FULL_OPENCV": [112.0, 108.0, 80.7, 59.2, -0.12, 0.04, 0.002, -0.003, 0.01, 0.02, -0.01, 0.005],
    "OPENCV_FISHEYE": [75.0, 76.0, 80.3, 59.6, 0.05, -0.02, 0.01, -0.003],
    "SIMPLE_RADIAL_FISHEYE": [75.0, 80.3, 59.6, 0.06],
    "RADIAL_FISHEYE": [75.0, 80.3, 59.6, 0.06, -0.01],
}


def draw_dots(ref: "pycolmap.Camera", K_new: np.ndarray, xy: np.ndarray) -> np.ndarray:
    """[H, W, 3] uint8 distorted image of Gaussian dots centred at [n, 2] pinhole positions
    `xy` of K_new: each pixel centre's ray (pycolmap) is projected by K_new and shaded."""
    gy, gx = np.mgrid[0:H, 0:W] + 0.5
    rays = ref.cam_from_img(np.stack([gx.ravel(), gy.ravel()], 1))  # [H*W, 2] normalised (x/z, y/z)
    px = rays * K_new[[0, 1], [0, 1]] + K_new[:2, 2]  # [H*W, 2] in the pinhole image
    img = np.zeros(H * W)
    for x, y in xy:
        img += PEAK * np.exp(-((px[:, 0] - x) ** 2 + (px[:, 1] - y) ** 2) / (2 * SIGMA ** 2))
    img = np.clip(np.round(img), 0, 255).astype(np.uint8).reshape(H, W)
    return np.repeat(img[..., None], 3, axis=2)


def centroid(img: np.ndarray, x: float, y: float) -> np.ndarray:
    x0, y0 = int(np.floor(x)) - HALF, int(np.floor(y)) - HALF
    win = img[y0:y0 + 2 * HALF + 1, x0:x0 + 2 * HALF + 1, 0].astype(np.float64)
    gy, gx = np.mgrid[y0:y0 + 2 * HALF + 1, x0:x0 + 2 * HALF + 1] + 0.5
    return np.array([(win * gx).sum(), (win * gy).sum()]) / win.sum()


@pytest.mark.parametrize("model", list(MODELS))
def test_undistorted_image_puts_points_where_the_pinhole_projects_them(model):
    params = np.array(MODELS[model])
    ref = pycolmap.Camera(model=model, width=W, height=H, params=params)
    K, _ = split_params(model, params)
    u = plan_undistortion(model, params, K, (W, H), f"camera ({model})")
    Wn, Hn = u.size
    assert 0.5 * W < Wn <= W and 0.5 * H < Hn <= H, u.size
    # Points on a grid of directions spanning the pinhole output, 16 px apart there, at
    # depths 1..3 (depth must not matter).
    xs, ys = np.arange(10, Wn - 10, 16) + 0.3, np.arange(10, Hn - 10, 16) + 0.7
    px = np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2)  # [n, 2] where the pinhole puts them
    rays = np.stack([(px[:, 0] - u.K_new[0, 2]) / u.K_new[0, 0], (px[:, 1] - u.K_new[1, 2]) / u.K_new[1, 1],
                     np.ones(len(px))], 1)
    points = rays * np.linspace(1, 3, len(px))[:, None]  # [n, 3] camera frame
    distorted = ref.img_from_cam(points)  # [n, 2] pycolmap's projection
    inside = ((distorted > HALF + 1) & (distorted < np.array([W, H]) - HALF - 1)).all(1)
    assert inside.mean() > 0.7, "the grid should fall mostly inside the stored image"
    points, px, distorted = points[inside], px[inside], distorted[inside]
    expect = (points / points[:, 2:]) @ u.K_new.T  # the new pinhole K's projection
    np.testing.assert_allclose(expect[:, :2], px, atol=1e-9)

    np.testing.assert_allclose(ref.cam_from_img(distorted), points[:, :2] / points[:, 2:], atol=1e-6)  # pycolmap agrees with itself
    out = u(draw_dots(ref, u.K_new, expect[:, :2]))
    assert out.shape == (Hn, Wn, 3)
    found = np.array([centroid(out, x, y) for x, y in expect[:, :2]])
    err = np.linalg.norm(found - expect[:, :2], axis=1)
    assert err.max() < 0.1, f"{model}: max {err.max():.3f} px, mean {err.mean():.3f} px over {len(err)} dots"


WIDE = {"OPENCV_FISHEYE": [20.0, 20.0, 80.0, 60.0, 0.0, 0.0, 0.0, 0.0]}  # the border at up to 229 degrees


@pytest.mark.parametrize("model", [*MODELS, "WIDE"])
def test_crop_holds_only_pixels_of_the_stored_image(model):
    """Every output pixel samples inside the stored image's pixel area (no black border):
    the crop is the valid region; a fisheye wider than 180 degrees gives a pinhole crop of
    its centre."""
    model, params = ("OPENCV_FISHEYE", np.array(WIDE["OPENCV_FISHEYE"])) if model == "WIDE" else (model, np.array(MODELS[model]))
    K, _ = split_params(model, params)
    u = plan_undistortion(model, params, K, (W, H), "camera")
    mx, my = u.maps()
    assert mx.shape == (u.size[1], u.size[0])
    assert mx.min() >= -0.5 and mx.max() <= W - 0.5 and my.min() >= -0.5 and my.max() <= H - 0.5, \
        (mx.min(), mx.max(), my.min(), my.max())


def test_zero_distortion_is_left_alone():
    assert plan_undistortion("SIMPLE_RADIAL", np.array([100.0, 80, 60, 0.0]), np.eye(3), (W, H), "c") is None
    assert plan_undistortion("PINHOLE", np.array([100.0, 100, 80, 60]), np.eye(3), (W, H), "c") is None
    fisheye = np.array([100.0, 80, 60, 0.0])  # equidistant: still not a pinhole
    assert plan_undistortion("SIMPLE_RADIAL_FISHEYE", fisheye, split_params("SIMPLE_RADIAL_FISHEYE", fisheye)[0],
                             (W, H), "c") is not None


def test_fisheye_that_folds_back_is_refused_clearly():
    """theta (1 - 0.5 theta^2) peaks at theta 0.82 (radius 0.54), inside the image (radius
    up to 1.3): pixels beyond have no ray, and two angles share each radius below."""
    params = np.array([75.0, 75.0, 80.0, 60.0, -0.5, 0.0, 0.0, 0.0])
    K, _ = split_params("OPENCV_FISHEYE", params)
    with pytest.raises(DataError, match="cameras.bin camera 3 .* not monotonic"):
        plan_undistortion("OPENCV_FISHEYE", params, K, (W, H), "cameras.bin camera 3 (OPENCV_FISHEYE)")
