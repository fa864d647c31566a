"""Bad inputs to `rasterize` raise ValueError naming the argument and what was expected."""

import pytest
import torch

from distsplat.render import rasterize
from tests.unit.scenes import random_scene


def call(**overrides):
    s = random_scene(n=10, n_cameras=2)
    kwargs = dict(sh_degree=None)
    args = {k: s[k] for k in ("means", "quats", "scales", "opacities", "colors", "viewmats", "Ks", "width", "height")}
    for k, v in overrides.items():
        (args if k in args else kwargs)[k] = v
    return rasterize(*args.values(), **kwargs)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(means=torch.zeros(10, 2)), r"`means` must have shape \[N, 3\], got \(10, 2\)"),
        (dict(quats=torch.zeros(10, 3)), r"`quats` must have shape \[N, 4\]"),
        (dict(scales=torch.zeros(9, 3)), r"mismatched N: `scales` has N=9 .* but `means` has N=10"),
        (dict(opacities=torch.zeros(10, 1)), r"`opacities` must have shape \[N\]"),
        (dict(colors=torch.zeros(11, 3)), r"mismatched N: `colors`"),
        (dict(viewmats=torch.zeros(2, 3, 4)), r"`viewmats` must have shape \[C, 4, 4\]"),
        (dict(Ks=torch.zeros(3, 3, 3)), r"mismatched C: `Ks` has C=3 .* but `viewmats` has C=2"),
        (dict(means="not a tensor"), r"`means` must be a torch.Tensor of shape \[N, 3\], got str"),
        (dict(means=torch.zeros(10, 3, dtype=torch.int64)), r"`means` must be a floating-point tensor"),
        (dict(scales=torch.zeros(10, 3, dtype=torch.float64)), r"`scales` is torch.float64 .* but `means` is torch.float32"),
        (dict(width=0), r"`width` must be a positive int, got 0"),
        (dict(height=-3), r"`height` must be a positive int, got -3"),
        (dict(width=32.0), r"`width` must be a positive int, got 32.0"),
        (dict(backend="cuda"), r"unknown backend 'cuda'; expected one of auto, torch, gsplat"),
        (dict(backend="gsplat"), r"backend 'gsplat' .* needs CUDA tensors, got tensors on cpu"),
        (dict(render_mode="RGBD"), r"unknown render_mode 'RGBD'"),
        (dict(rasterize_mode="aa"), r"unknown rasterize_mode 'aa'"),
        (dict(sh_degree=5, colors=torch.zeros(10, 36, 3)), r"`sh_degree` must be an int in 0..4"),
        (dict(sh_degree=2, colors=torch.zeros(10, 4, 3)), r"K=4 SH coefficients but sh_degree=2 needs at least 9"),
        (dict(sh_degree=1, colors=torch.zeros(10, 3)), r"`colors` must have shape \[N, K, 3\]"),
        (dict(backgrounds=torch.zeros(2, 4)), r"`backgrounds` must have shape \[C, 3\]"),
        (dict(near_plane=2.0, far_plane=1.0), r"need 0 < near_plane < far_plane"),
        (dict(eps2d=-0.1), r"`eps2d` must be >= 0"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(overrides, message):
    with pytest.raises(ValueError, match=message):
        call(**overrides)


def test_non_finite_values_are_named():
    s = random_scene(n=10)
    means, scales = s["means"].clone(), s["scales"].clone()
    means[3, 1] = float("nan")
    scales[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"`means`, `scales` contain NaN or Inf"):
        call(means=means, scales=scales)
    vm = s["viewmats"].clone()
    vm[1, 0, 3] = float("nan")
    with pytest.raises(ValueError, match=r"`viewmats` contain NaN or Inf"):
        call(viewmats=vm)
    # The check can be turned off (no host sync); then nothing is raised up front.
    call(means=s["means"], check_finite=False)
