"""The trainer renders without comparing the ranks' cameras every step; it compares a digest
of the scene's cameras and the batcher once, when training starts (train/scene_setup.py).
Ranks that loaded different cameras stop with the same message on every rank."""

import numpy as np
import pytest

from distsplat.train.scene_setup import camera_digest


@pytest.mark.parametrize("W", [2, 3])
def test_different_cameras_on_one_rank_stop_every_rank_alike(run_workers, W):
    same = run_workers("workers:agree_cameras_case", W, -1)
    assert all(r["raised"] is None for r in same)
    results = run_workers("workers:agree_cameras_case", W, W - 1)
    messages = {r["raised"] for r in results}
    assert len(messages) == 1 and all(r["agreed"] for r in results), results
    msg = messages.pop()
    assert "the ranks loaded different cameras" in msg and f"[{W - 1}]" in msg and str(list(range(W - 1))) in msg


def test_camera_digest_sees_one_ulp_the_split_and_the_batcher():
    class Scene:
        camtoworlds = np.tile(np.eye(4)[None], (4, 1, 1))
        Ks, widths, heights = np.ones((4, 3, 3)), np.full(4, 8), np.full(4, 6)

    state = {"num_cameras": 3, "world_size": 2, "cameras_per_rank": 1, "seed": 0, "epoch": 0, "step": 0}
    d = camera_digest(Scene, np.arange(3), state)
    assert d == camera_digest(Scene, np.arange(3), {**state, "epoch": 5, "step": 2}), "the position is not a layout"
    assert d != camera_digest(Scene, np.array([0, 1, 3]), state)
    assert d != camera_digest(Scene, np.arange(3), {**state, "cameras_per_rank": 2})
    assert d != camera_digest(Scene, np.arange(3), {**state, "seed": 1})
    Scene.camtoworlds = Scene.camtoworlds.copy()
    Scene.camtoworlds[2, 1, 3] = np.nextafter(0.0, 1.0)
    assert d != camera_digest(Scene, np.arange(3), state)
    assert 0 <= d < 2**62
