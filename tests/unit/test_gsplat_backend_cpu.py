"""What of backend `gsplat` a CPU can check: its calls into gsplat 1.5.3's Python wrappers
pass their shape assertions, and its own maths around the kernels (background compositing,
camera centres). gsplat's CUDA ops are replaced by fakes below the wrappers, so gsplat's
real argument checks run (tests/cuda runs the kernels themselves)."""

import pytest
import torch

import gsplat.cuda._wrapper as gw
from distsplat.render import gsplat_backend, project
from tests.unit.scenes import GAUSSIAN_KEYS, look_at_viewmat, random_scene, render_args, with_grad

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)

ALPHA, VALUE = 0.25, 0.5  # what the fake kernel "renders" everywhere


class _FakeRasterize:
    """Stands in for gsplat's `_RasterizeToPixels` autograd Function: a constant image
    of the shape the kernel would return (images from isect_offsets [C, th, tw])."""

    @staticmethod
    def apply(means2d, conics, colors, opacities, backgrounds, masks, width, height, tile_size,
              isect_offsets, flatten_ids, absgrad):
        dims = isect_offsets.shape[:-2]
        assert backgrounds is None or backgrounds.shape == dims + (colors.shape[-1],)
        out = colors.new_full(dims + (height, width, colors.shape[-1]), VALUE) + 0 * colors.sum()
        return out, colors.new_full(dims + (height, width, 1), ALPHA)


def _fake_lazy(name):
    def call(means2d, radii, depths, image_ids, gaussian_ids, I, tile_size, tw, th, *rest):
        assert name in ("intersect_tile", "intersect_offset"), name
        return None, torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int32)
    if name == "intersect_offset":
        return lambda isect_ids, I, tw, th: torch.zeros(I, th, tw, dtype=torch.int32)
    return call


@pytest.fixture
def fake_kernels(monkeypatch):
    monkeypatch.setattr(gw, "_RasterizeToPixels", _FakeRasterize)
    monkeypatch.setattr(gw, "_make_lazy_cuda_func", _fake_lazy)
    monkeypatch.setattr(gsplat_backend, "ensure_gsplat_ops", lambda: None)  # no extension on CPU


def _pairs(channels: int):
    scene = random_scene(n=30, n_cameras=2, channels=channels)
    pairs, _ = project(*render_args(scene), backend="torch")
    assert len(pairs) > 0
    return pairs


@pytest.mark.parametrize("channels", [3, 40])  # 40: two kernel calls of CHANNEL_CHUNK = 32
def test_backgrounds_are_composited_outside_the_kernel(fake_kernels, channels):
    # gsplat 1.5.3's packed wrapper asserts backgrounds.shape == (D,) (image dims from
    # means2d [nnz, 2] are ()): passing our [C, D] backgrounds to it raised AssertionError.
    pairs = _pairs(channels)
    bg = torch.rand(2, channels, generator=torch.Generator().manual_seed(0))
    colors, alphas = gsplat_backend.rasterize_pairs(pairs, 2, 40, 30, backgrounds=bg)
    assert colors.shape == (2, 30, 40, channels) and alphas.shape == (2, 30, 40, 1)
    expected = VALUE + (1 - ALPHA) * bg[:, None, None, :]  # render + (1 - alpha) * bg
    torch.testing.assert_close(colors, expected.expand_as(colors), rtol=0, atol=1e-6)
    no_bg, _ = gsplat_backend.rasterize_pairs(pairs, 2, 40, 30)
    torch.testing.assert_close(no_bg, torch.full_like(no_bg, VALUE), rtol=0, atol=0)


def test_camera_centers_is_the_inverse_of_rigid_viewmats():
    eyes = [(3.0, 1.0, -2.0), (-1.0, 4.0, 0.5), (0.2, -0.3, 5.0)]
    V = torch.stack([look_at_viewmat(e, dtype=torch.float64) for e in eyes])  # [3, 4, 4]
    got = gsplat_backend.camera_centers(V)
    # R orthonormal to float64 rounding: |-R^T t - eye| ~ |eye| * 1e-16 * a few; 1e-12 is far.
    torch.testing.assert_close(got, torch.tensor(eyes, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(got, torch.linalg.inv(V)[:, :3, 3], rtol=0, atol=1e-12)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("empty", ["gaussians", "cameras"])
def test_no_gaussian_or_no_camera_gives_zero_pairs_without_the_kernels(monkeypatch, packed, empty):
    """A rank whose chunk is empty (or a batch with no camera) never reaches gsplat's
    projection kernel, which dies with SIGFPE on N = 0 (seen on an H100 with W=2): zero
    pairs come back, and every input still gets a gradient of its own shape."""
    def forbidden(*args, **kwargs):
        raise AssertionError("gsplat's projection must not run on an empty input")

    monkeypatch.setattr(gw, "fully_fused_projection", forbidden)
    scene = with_grad(random_scene(n=0 if empty == "gaussians" else 20, sh_degree=2))
    if empty == "cameras":
        scene["viewmats"], scene["Ks"] = scene["viewmats"][:0], scene["Ks"][:0]
    C, N = scene["viewmats"].shape[0], scene["means"].shape[0]
    pairs, dense = project(*render_args(scene), backend="gsplat", sh_degree=2, packed=packed)
    assert len(pairs) == 0 and pairs.colors.shape == (0, 3) and pairs.radii.dtype == torch.int32
    assert (dense is None) == packed
    if not packed:
        assert dense["means2d"].shape == (C, N, 2) and dense["radii"].shape == (C, N, 2)
    (pairs.means2d.sum() + pairs.colors.sum() + pairs.opacities.sum()).backward()
    for k in GAUSSIAN_KEYS:
        assert scene[k].grad is not None and scene[k].grad.shape == scene[k].shape, k
        assert not scene[k].grad.any(), k
