"""train/model/size_groups.py: a batch of mixed image sizes split into one render per size, and
the renders' metas merged for densification.

The grouping is checked against a direct enumeration; the merge against gsplat's own
DefaultStrategy normalization applied to each size's render on its own (n_cameras = the
global batch, which every group's loss is divided by): the merged meta must leave the
strategy's accumulators (grad2d, count) as those separate updates do, and give every pair
its radius in its own image's units."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distsplat.data.loader import Batch
from distsplat.data.synthetic import make_synthetic_scene
from distsplat.render import rasterize
from distsplat.train.model.size_groups import group_cameras, group_images, merge_meta, size_groups
from distsplat.train.model.strategies import DefaultStrategy

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)


def test_groups_are_ordered_by_height_then_width_and_keep_batch_order():
    widths = [40, 24, 40, 32, 24, 40]
    heights = [30, 32, 30, 30, 32, 30]
    owner = [0, 0, 1, 1, 2, 2]
    for rank in range(3):
        groups = size_groups(widths, heights, owner, rank)
        assert [(g.height, g.width) for g in groups] == [(30, 32), (30, 40), (32, 24)]
        assert [g.positions.tolist() for g in groups] == [[3], [0, 2, 5], [1, 4]]
        assert not any(g.whole for g in groups)
        own_positions = [p for p in range(6) if owner[p] == rank]  # this rank's cameras, batch order
        for g in groups:
            # `own` indexes the rank's own images: exactly its cameras of this size, in batch order
            assert [own_positions[j] for j in g.own] == [p for p in g.positions.tolist() if owner[p] == rank]
        assert sorted(j for g in groups for j in g.own) == list(range(len(own_positions)))


def test_one_size_is_one_whole_group_whose_select_is_the_identity():
    (g,) = size_groups([32, 32, 32], [24, 24, 24], [0, 1, 1], 1)
    assert g.whole and (g.width, g.height) == (32, 24) and g.own == [0, 1]
    x = torch.arange(3)
    assert g.select(x) is x and g.select(None) is None


def test_select_and_group_images_pick_the_rows_of_the_group():
    images = [torch.full((h, w, 3), i, dtype=torch.uint8) for i, (w, h) in enumerate([(8, 6), (4, 5), (8, 6)])]
    batch = Batch(step=0, cameras=[7, 3, 9], images=images)
    groups = size_groups([9, 8, 4, 8], [6, 6, 5, 6], [0, 1, 1, 1], 1)  # rank 1 owns positions 1, 2, 3
    assert [(g.width, g.height) for g in groups] == [(4, 5), (8, 6), (9, 6)]
    assert torch.equal(groups[1].select(torch.arange(4) * 10), torch.tensor([10, 30]))
    assert group_images(batch, groups[0])[:, 0, 0, 0].tolist() == [1]
    assert group_images(batch, groups[1])[:, 0, 0, 0].tolist() == [0, 2]
    assert group_cameras(batch, groups[1]) == [7, 9]
    empty = group_images(batch, groups[2])  # a size this rank owns no camera of
    assert empty.shape == (0, 6, 9, 3)


def test_size_groups_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="one entry per batch camera"):
        size_groups([8, 8], [6], [0, 0], 0)


SIZES = [(40, 30), (24, 32)]  # two aspects: x and y rescale differently


def _render_groups(packed: bool, absgrad: bool):
    """Two size groups of a synthetic scene rendered separately, one loss, one backward."""
    scene = make_synthetic_scene(num_cameras=4, num_gaussians=200, width=40, height=30, seed=2)
    g = {k: torch.from_numpy(v).float() for k, v in scene.gaussians.items()}
    viewmats = torch.from_numpy(np.linalg.inv(scene.camtoworlds)).float()  # [4, 4, 4]
    widths = [SIZES[i % 2][0] for i in range(4)]
    heights = [SIZES[i % 2][1] for i in range(4)]
    groups = size_groups(widths, heights, [0] * 4, 0)
    f = scene.Ks[0][0, 0] / 40.0
    g["means"].requires_grad_(True)
    loss, metas = 0.0, []
    for grp in groups:
        w, h = grp.width, grp.height
        K = torch.tensor([[f * max(w, h), 0, w / 2], [0, f * max(w, h), h / 2], [0, 0, 1.0]], dtype=torch.float32)
        out, _, meta = rasterize(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                                 grp.select(viewmats), K.expand(len(grp.positions), 3, 3), w, h,
                                 packed=packed, backend="torch", absgrad=absgrad)
        loss = loss + ((out - 0.5) ** 2).flatten(1).mean(1).sum() / 4  # each image its mean, / global batch
        metas.append(meta)
    merged = merge_meta(metas, groups, n_cameras=4)
    loss.backward()
    return groups, metas, merged


def _strategy_state(metas, packed: bool, absgrad: bool, n: int = 200):
    s = DefaultStrategy(absgrad=absgrad, refine_scale2d_stop_iter=1000)
    state = s.initialize_state()
    for meta in metas:
        s._update_state({"means": torch.zeros(n, 3)}, state, meta, packed=packed)
    return state


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("absgrad", [False, True])
def test_merged_meta_normalizes_each_size_as_its_own_render(packed, absgrad):
    groups, metas, merged = _render_groups(packed, absgrad)
    # The reference: gsplat's normalization of each size's render on its own, with
    # n_cameras = the global batch (each group's loss is divided by it).
    for m in metas:
        m["n_cameras"] = 4
    ref = _strategy_state(metas, packed, absgrad)
    got = _strategy_state([merged], packed, absgrad)
    assert ref["count"].sum() > 100  # many visible pairs, in both sizes
    torch.testing.assert_close(got["count"], ref["count"], rtol=0, atol=0)
    # float32: the merge rescales by (W_g / W_0) and then gsplat's (W_0 / 2 * C), the
    # reference by (W_g / 2 * C) at once: each gradient is 2 roundings (2 x 6e-8 relative)
    # apart, its norm and the sums of those positive norms stay within ~3e-7 relative.
    torch.testing.assert_close(got["grad2d"], ref["grad2d"], rtol=2e-6, atol=0)
    assert ref["grad2d"].max() > 0
    # Radii: gsplat keeps the max by an indexed assignment, where the last of a Gaussian's
    # pairs wins (its "should be a scatter max"), so the accumulators depend on the pairs'
    # order, not only their values; what the merge must give is each pair's radius in its
    # own image's units, radii / max(W_g, H_g), which gsplat reads as radii / max(W_0, H_0).
    own_units = torch.cat([m["radii"].float() / max(g.width, g.height) for m, g in zip(metas, groups)])
    W0, H0 = merged["width"], merged["height"]
    torch.testing.assert_close(merged["radii"] / max(W0, H0), own_units, rtol=3e-7, atol=0)  # 3 float32 roundings vs 1
    assert own_units.max() > 0


def test_merging_without_rescaling_would_be_wrong():
    """The check above can fail: the reference differs from a merge that treats every pair
    as the first size's (the 24x32 group's x gradients are scaled by 32 instead of 24)."""
    groups, metas, merged = _render_groups(True, False)
    for m in metas:
        m["n_cameras"] = 4
    ref = _strategy_state(metas, True, False)
    merged["means2d"].scales = [(1.0, 1.0)] * len(groups)
    wrong = _strategy_state([merged], True, False)
    assert not torch.allclose(wrong["grad2d"], ref["grad2d"], rtol=1e-3)


def test_a_single_group_meta_is_passed_through():
    meta = {"means2d": torch.zeros(3, 2), "n_cameras": 2}
    groups = size_groups([8, 8], [6, 6], [0, 0], 0)
    assert merge_meta([meta], groups, 2) is meta


def test_grouped_loss_weighs_each_image_as_if_rendered_alone():
    """The trainer's sum over size groups of (own images' losses / global batch) against
    each image rendered alone at its size: the same loss and the same gradients. Float64:
    both add the same terms, in orders that may differ; sums of ~1e3 pixel terms round at
    ~1e3 x 1.1e-16 = 1e-13 relative, so rtol 1e-12 for the loss, and 1e-9 for gradient
    components, whose terms may cancel (atol 1e-15 for those that cancel to ~0)."""
    from distsplat.train.scoring.losses import photometric_loss

    scene = make_synthetic_scene(num_cameras=4, num_gaussians=200, width=40, height=30, seed=2)
    g = {k: torch.from_numpy(v).double().requires_grad_(True) for k, v in scene.gaussians.items()}
    viewmats = torch.from_numpy(np.linalg.inv(scene.camtoworlds)).double()  # [4, 4, 4]
    sizes = [SIZES[i % 2] for i in range(4)]
    f = scene.Ks[0][0, 0] / 40.0
    Ks = torch.stack([torch.tensor([[f * max(w, h), 0, w / 2], [0, f * max(w, h), h / 2], [0, 0, 1.0]],
                                   dtype=torch.float64) for w, h in sizes])  # [4, 3, 3]
    gen = torch.Generator().manual_seed(0)
    targets = [torch.rand(h, w, 3, generator=gen, dtype=torch.float64) for w, h in sizes]

    def render(idx, w, h):
        out, _, _ = rasterize(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"], viewmats[idx],
                              Ks[idx], w, h, backend="torch")
        return out

    loss = 0.0
    for grp in size_groups([w for w, _ in sizes], [h for _, h in sizes], [0] * 4, 0):
        gt = torch.stack([targets[p] for p in grp.positions.tolist()])
        loss = loss + photometric_loss(render(grp.positions, grp.width, grp.height), gt, 0.2) / 4
    grads = torch.autograd.grad(loss, list(g.values()))
    alone = sum(photometric_loss(render([i], w, h), targets[i][None], 0.2) for i, (w, h) in enumerate(sizes)) / 4
    ref = torch.autograd.grad(alone, list(g.values()))
    torch.testing.assert_close(loss, alone, rtol=1e-12, atol=0)
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-15)
    assert all(float(r.abs().max()) > 0 for r in ref)
