"""The distributed render on a GPU. Needs one GPU (never more):

- W=1 on CUDA (backend gsplat, the real garden point cloud) against the one-process
  `rasterize`, forward and backward;
- the host syncs of one W=1 forward+backward, counted by CUDA's sync debug mode, equal
  the documented number (distsplat/distributed/render.py: ours 1, gsplat's packed
  projection 1, isect_tiles 1);
- W=2 ranks sharing the ONE GPU in shared-GPU mode (gloo, collectives staged through
  pinned host memory) against the one-process `rasterize` on the same GPU: renders and
  every parameter gradient, backend torch in float64 (tight: only summation order may
  differ) and backend gsplat in float32, on the scenes of tests/distributed/scenes.py.
"""

import sys
import warnings
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from distsplat.distributed import distributed_rasterize, staging
from distsplat.render import rasterize
from tests.garden import load_garden
from tests.unit.scenes import GAUSSIAN_KEYS, render_args, with_grad

DIST_TESTS = Path(__file__).resolve().parents[1] / "distributed"
if str(DIST_TESTS) not in sys.path:  # the harness and scenes of tests/distributed
    sys.path.insert(0, str(DIST_TESTS))

from harness import run_workers  # noqa: E402
from scenes import CASES, HEIGHT, PARAM_NAMES, WIDTH, dense_means2d_grad  # noqa: E402
from staging_workers import DTYPES, case_inputs, device_loss  # noqa: E402

pytestmark = pytest.mark.cuda

SEED = 13
# Syncs of one packed RGB forward+backward at W = 1 with backend gsplat and no SH, as CUDA's
# sync debug mode reports them (render.py's module docstring): ours, a user's call (checks on,
# owners on the device) reads its status once, the trainer's (device checks off, owners on the
# host) nothing; gsplat's, its packed projection's pair count. isect_tiles' `.item()`
# (csrc/Intersect.cpp) is not among the reported ones (measured on an H100, torch 2.11,
# gsplat 1.5.3, before the lean step). Backward has none.
OURS, GSPLAT_OWN = 1, 1
OURS_TRAINER = 0


def _garden(shared_data):
    return load_garden("cuda", max_points=40_000, downscale=2, path=shared_data / "test_garden.npz")


def _loss(colors, alphas):
    w = torch.rand(colors.shape, generator=torch.Generator().manual_seed(0)).to(colors.device)
    return (colors * w).sum() + alphas.sum()


def _assert_equal_up_to_atomics(got, want, what):
    """gsplat's backward adds float32 gradients with atomicAdd in no fixed order, so two
    runs of the same render differ by reordered float32 sums: K terms reordered move a sum
    by at most K * 2^-24 * sum|terms|; with K up to a few thousand pixel contributions that
    is ~1e-4 of the terms' magnitude, and 1e-3 of the largest gradient leaves room for
    cancellation."""
    assert want.abs().max() > 0, f"{what}: the loss must reach it"
    err = (got - want).abs().max() / want.abs().max()
    assert err < 1e-3, f"{what}: max diff {err:.3g} of the largest gradient"
    assert (got - want).norm() <= 1e-3 * want.norm(), what


def test_w1_on_cuda_equals_rasterize(shared_data):
    scene = _garden(shared_data)
    C = scene["viewmats"].shape[0]
    s_d, s_r = with_grad(scene), with_grad(scene)
    owner = torch.zeros(C, dtype=torch.int64, device="cuda")
    c_d, a_d, meta = distributed_rasterize(*render_args(s_d), owner, backend="gsplat")
    c_r, a_r, meta_r = rasterize(*render_args(s_r), backend="gsplat")
    assert a_r.mean() > 0.1
    assert torch.equal(meta["own_cameras"].cpu(), torch.arange(C))
    assert meta["own_cameras"].device == c_d.device
    # The same kernels on the same pairs in the same order (float32 through the payload is
    # exact): the images are expected identical; 1e-6 is a few float32 ulps of 1.
    torch.testing.assert_close(c_d, c_r, atol=1e-6, rtol=0)
    torch.testing.assert_close(a_d, a_r, atol=1e-6, rtol=0)
    _loss(c_d, a_d).backward()
    _loss(c_r, a_r).backward()
    for k in GAUSSIAN_KEYS:
        _assert_equal_up_to_atomics(s_d[k].grad, s_r[k].grad, k)
    _assert_equal_up_to_atomics(meta["means2d"].grad, meta_r["means2d"].grad, "means2d")
    assert meta["comm"]["host_syncs"] == OURS


@pytest.mark.parametrize("mode", ["user", "trainer"])
def test_w1_host_syncs_are_the_documented_ones(shared_data, mode):
    """torch.cuda.set_sync_debug_mode("warn") warns at every synchronizing CUDA call
    (a blocking copy, .item(), a stream sync), also inside gsplat's C++ and in backward.
    user: the defaults and a device owner tensor; trainer: check_finite and check_cameras off,
    the owners as host ints (Trainer.train_step's call)."""
    scene = _garden(shared_data)
    C = scene["viewmats"].shape[0]
    if mode == "user":
        owner, checks, ours = torch.zeros(C, dtype=torch.int64, device="cuda"), {}, OURS
    else:
        owner, checks, ours = [0] * C, {"check_finite": False, "check_cameras": False}, OURS_TRAINER

    def step():
        s = with_grad(scene)
        colors, alphas, meta = distributed_rasterize(*render_args(s), owner, backend="gsplat", **checks)
        colors.sum().add(alphas.sum()).backward()
        return meta

    step()  # warm-up: gsplat's extension load, cub's scratch allocations
    torch.cuda.synchronize()
    before = staging.host_syncs()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            meta = step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchronizing CUDA operation" in str(w.message)]
    where = "\n".join(f"{w.filename}:{w.lineno}: {w.message}" for w in syncs)
    assert len(syncs) == ours + GSPLAT_OWN, f"{len(syncs)} synchronizing calls:\n{where}"
    assert sum(w.filename.endswith("render.py") and "distsplat" in w.filename for w in syncs) == ours, where
    assert meta["comm"]["host_syncs"] == staging.host_syncs() - before == ours


# ------------------------------------------------------------ W=2 on one shared GPU

CONFIGS = [("torch", "float64"), ("gsplat", "float32")]


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
def shared_world(request):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    backend, dtype = request.param
    results = run_workers("staging_workers:staged_cases", 2, list(CASES), SEED, backend, dtype,
                          shared_gpu=True, timeout_s=400)
    return backend, dtype, results


@lru_cache(maxsize=None)
def shared_reference(name, backend, dtype):
    """One process, all Gaussians, all cameras, on the same GPU: the reference."""
    layout = case_inputs(name, 2, torch.device("cuda", 0), DTYPES[dtype])
    params = [layout["gaussians"][k].clone().requires_grad_() for k in PARAM_NAMES]
    colors, alphas, meta = rasterize(
        *params, layout["viewmats"], layout["Ks"], WIDTH, HEIGHT, sh_degree=layout["sh_degree"],
        packed=layout["packed"], backend=backend, **layout["render_kwargs"],
    )
    C = layout["viewmats"].shape[0]
    device_loss(colors, alphas, torch.arange(C), SEED).backward()
    return {
        "colors": colors.detach().cpu(), "alphas": alphas.detach().cpu(),
        "grads": [p.grad.cpu() for p in params],
        "means2d_grad": dense_means2d_grad(meta, params[0].shape[0], 0, C),
    }


def test_shared_gpu_ranks_run_where_they_should(shared_world):
    _, _, results = shared_world
    for rank, res in enumerate(results):
        assert res["_context"] == {"device": "cuda:0", "backend": "gloo", "shared_gpu": True,
                                   "forced": False}, f"rank {rank}"
        for name in CASES:
            assert res[name]["devices"]["colors"] == "cuda:0"
            # Forward: the count transfer + the staged payload; backward: the staged
            # reverse payload (staging.py).
            assert res[name]["syncs"] == (2, 1), f"rank {rank}, {name}"
        h = res["_helpers"]
        assert h["moved_device"] == "cuda:0"
        assert h["raised"] == "rank 0: bad flag on rank 0"
        v = [torch.arange(4, dtype=torch.float64) + 10.0 * r for r in range(2)]
        assert torch.equal(h["sum"], v[0] + v[1]) and torch.equal(h["max"], v[1])
        assert torch.equal(h["broadcast"], v[1])


@pytest.mark.parametrize("name", list(CASES))
def test_shared_gpu_w2_equals_one_process(shared_world, name):
    backend, dtype, results = shared_world
    ref = shared_reference(name, backend, dtype)
    if dtype == "float64":
        tol = dict(rtol=1e-9, atol=1e-11)  # as tests/distributed: only summation order differs
    else:
        tol = dict(rtol=0, atol=1e-6)  # same kernels, same pairs, same order (see W=1)
    for rank, res in enumerate(results):
        own = res[name]["own"]
        torch.testing.assert_close(res[name]["colors"], ref["colors"][own], **tol,
                                   msg=lambda m: f"rank {rank}, {name}: {m}")
        torch.testing.assert_close(res[name]["alphas"], ref["alphas"][own], **tol,
                                   msg=lambda m: f"rank {rank}, {name}: {m}")
    grads = [torch.cat([res[name]["grads"][i] for res in results]) for i in range(len(PARAM_NAMES))]
    m2d = sum(res[name]["means2d_grad"] for res in results)
    if dtype == "float64":
        for got, want, pname in zip(grads, ref["grads"], PARAM_NAMES):
            torch.testing.assert_close(got, want, **tol, msg=lambda m: f"{name}, grad of {pname}: {m}")
        torch.testing.assert_close(m2d, ref["means2d_grad"], **tol)
    else:
        for got, want, pname in zip(grads, ref["grads"], PARAM_NAMES):
            _assert_equal_up_to_atomics(got, want, f"{name}, grad of {pname}")
        _assert_equal_up_to_atomics(m2d, ref["means2d_grad"], f"{name}, means2d")


# ------------------------------------------------- 20 training steps, W=2 and 3 on one GPU

TRAIN_STEPS, TRAIN_BATCH, TRAIN_LR = 20, 4, 0.01


@pytest.mark.parametrize("W", [2, 3])
def test_shared_gpu_training_reaches_the_one_process_parameters(W):
    """tests/distributed/test_training.py on the GPU with gsplat's kernels: 20 Adam steps
    of W ranks sharing the one GPU reach the parameters of one process training every
    Gaussian with `rasterize` on the same global batches. float32 and gsplat's atomicAdd
    backward make the two differ by reordered sums (~1e-6 of a gradient per step, which
    Adam's normalised step turns into ~1e-6 of LR for a well-determined parameter); a lost
    or mis-routed camera moves the parameters it sees by ~LR per step, 1e-2 here. So:
    relative L2 difference per tensor < 1e-3, against the several-percent a wrong
    exchange gives."""
    from scenes import train_loop

    want = train_loop(0, 1, TRAIN_STEPS, TRAIN_BATCH, TRAIN_LR, reference=True, backend="gsplat",
                      device="cuda", dtype=torch.float32)
    start = train_loop(0, 1, 0, TRAIN_BATCH, TRAIN_LR, reference=True, backend="gsplat", device="cuda",
                       dtype=torch.float32)
    results = run_workers("workers:train", W, TRAIN_STEPS, TRAIN_BATCH, TRAIN_LR, "gsplat", "float32",
                          shared_gpu=True)
    for k, v in want.items():
        got = torch.cat([r[k] for r in results])
        moved = (v - start[k]).norm()
        assert moved > 1e-2 * TRAIN_LR, f"{k}: training must move it"
        rel = float((got - v).norm() / moved)
        assert rel < 1e-3, f"W={W}, {k}: differs by {rel:.2e} of how far training moved it"
