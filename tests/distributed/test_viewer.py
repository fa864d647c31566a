"""The live viewer under 2 gloo ranks: its frames equal the one-process render of the
whole model, a port in use fails alike on every rank before any training, and polls
(with a pause) happen at the same steps on every rank, far fewer than the steps."""

import torch

from distsplat.render import rasterize
from harness import free_port
from scenes import make_gaussians
from viewer_workers import VIEWS, camera_for


def test_frames_equal_one_process_render(run_workers):
    g = {k: v.float() for k, v in make_gaussians(150, seed=11, sh_degree=1).items()}
    results = run_workers("viewer_workers:render_frames", 2, g, 1)
    assert all(image is None for image in results[1]), "only rank 0 (the camera's owner) gets the frame"
    for i, image in enumerate(results[0]):
        cam = camera_for(i)
        viewmat, K = cam.tensors(torch.device("cpu"))
        ref, _, _ = rasterize(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                              viewmat, K, cam.width, cam.height, sh_degree=1, backend="torch")
        assert image.shape == (cam.height, cam.width, 3)
        assert image.mean() > 0.01, f"view {i} sees nothing: a useless comparison"
        torch.testing.assert_close(image, ref[0].clamp(0, 1), rtol=1e-5, atol=1e-5)
    assert len(results[0]) == len(VIEWS)


def test_port_in_use_same_error_on_every_rank(run_workers):
    port = free_port()
    messages = run_workers("viewer_workers:port_in_use", 2, port)
    assert messages[0] == messages[1]
    assert f"--port {port}" in messages[0] and "already in use" in messages[0]


def test_polls_and_pause_agree_across_ranks(run_workers):
    steps, pause_at = 150, 40
    results = run_workers("viewer_workers:poll_schedule", 2, steps, 0.01, pause_at)
    assert results[0] == results[1], "ranks polled at different steps"
    polled = sorted(set(results[0]["polled"]))
    # No browser: a poll every max_wait_s (1 s), i.e. every ~100 steps of 10 ms, not every step.
    assert len(polled) <= 8, polled
    assert polled[0] == 1  # the first step polls (nothing measured yet)
    paused = results[0]["paused_at"]
    assert len(paused) == 1 and pause_at <= paused[0] < steps, paused
    # While paused, the hook kept polling at that step until the resume.
    assert results[0]["polled"].count(paused[0]) >= 2
