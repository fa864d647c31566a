"""Persistent Gaussian ids and the counter-based normal sampler (gaussians.py), and the
id-keyed split/duplicate (strategy_ops.py): what makes densification W-invariant."""

from __future__ import annotations

import math
import random

import pytest
import torch

from distsplat.train.model import strategy_ops
from distsplat.train.model.gaussians import (derive_ids, from_float_rows, hash_keys, initial_ids, normal_samples,
                                       splitmix64, to_float_rows)
from distsplat.train.model.strategies import DefaultStrategy

M64 = 1 << 64


def splitmix64_reference(x: int) -> int:
    """splitmix64 on Python ints modulo 2^64 (Steele et al. 2014; Vigna's C code)."""
    z = (x + 0x9E3779B97F4A7C15) % M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % M64
    return z ^ (z >> 31)


def test_splitmix64_matches_the_reference_bit_for_bit():
    rng = random.Random(0)
    xs = [0, 1, -1, 2**63 - 1, -(2**63), 0x9E3779B97F4A7C15 - M64] + [rng.randrange(-(2**63), 2**63) for _ in range(500)]
    got = splitmix64(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert [g % M64 for g in got] == [splitmix64_reference(x % M64) for x in xs]
    # hash_keys chains the keys: h = mix(mix(k0) ^ k1)
    assert hash_keys(3, 5).item() % M64 == splitmix64_reference(splitmix64_reference(3) ^ 5)


def test_normal_samples_are_a_function_of_the_id_not_of_order_or_chunking():
    ids = torch.cat([initial_ids((0, 300)), derive_ids(torch.arange(200), step=7, child=1)])  # [500]
    whole = normal_samples(11, 7, ids, 6)  # [500, 6]
    assert whole.shape == (500, 6) and whole.dtype == torch.float64
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))
    # Elementwise maths: a few ulp at most between vectorized paths of different lengths.
    torch.testing.assert_close(normal_samples(11, 7, ids[perm], 6), whole[perm], rtol=1e-14, atol=1e-15)
    chunks = torch.cat([normal_samples(11, 7, c, 6) for c in ids.split([1, 77, 222, 200])])
    torch.testing.assert_close(chunks, whole, rtol=1e-14, atol=1e-15)
    assert torch.equal(normal_samples(11, 7, ids, 6), whole)  # deterministic
    # Another seed or step is another stream: independent samples (|corr| ~ 1/sqrt(3000)).
    for other in (normal_samples(12, 7, ids, 6), normal_samples(11, 8, ids, 6)):
        assert abs(torch.corrcoef(torch.stack([other.flatten(), whole.flatten()]))[0, 1]) < 5 / math.sqrt(3000)


def test_normal_samples_are_standard_normal():
    """Moments of n = 1e5 samples against N(0, 1), each within 5 standard errors: mean
    (se 1/sqrt(n)), variance (se sqrt(2/n)), fourth moment 3 (se sqrt(96/n)), P(z < 1) =
    Phi(1) (se sqrt(p(1-p)/n)), and no correlation between a Gaussian's two samples."""
    n = 100_000
    z = normal_samples(5, 123, initial_ids((0, n)), 2)  # [n, 2]
    a, b = z[:, 0], z[:, 1]
    assert abs(a.mean()) < 5 / math.sqrt(n)
    assert abs(a.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs((a**4).mean() - 3) < 5 * math.sqrt(96 / n)
    p = 0.5 * (1 + math.erf(1 / math.sqrt(2)))
    assert abs((a < 1).double().mean() - p) < 5 * math.sqrt(p * (1 - p) / n)
    assert abs((a * b).mean()) < 5 / math.sqrt(n)  # E[ab] = 0, var 1
    assert torch.isfinite(z).all()


def test_derived_ids_are_distinct_and_travel_exactly_as_floats():
    parents = initial_ids((0, 1000))
    kids = torch.cat([derive_ids(parents, 5, c) for c in range(5)] + [derive_ids(parents, 6, 0)])
    assert len(torch.cat([parents, kids]).unique()) == 7000
    assert torch.equal(derive_ids(parents, 5, 1), derive_ids(parents.flip(0), 5, 1).flip(0))
    ids = torch.cat([kids, torch.tensor([0, -1, 2**63 - 1, -(2**63)])])
    for dtype in (torch.float32, torch.float64):  # move_rows carries them in the params' dtype
        rows = to_float_rows(ids).to(dtype)  # [N, 4]
        assert torch.equal(from_float_rows(rows, torch.int64), ids)
    x = torch.rand(5, 2)
    assert torch.equal(from_float_rows(to_float_rows(x), torch.float32), x)


def _params(n: int, seed: int = 0) -> torch.nn.ParameterDict:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.ParameterDict({
        "means": torch.randn(n, 3, generator=g, dtype=torch.float64),
        "scales": torch.log(torch.rand(n, 3, generator=g, dtype=torch.float64) * 0.5 + 0.01),
        "quats": torch.randn(n, 4, generator=g, dtype=torch.float64),
        "opacities": torch.randn(n, generator=g, dtype=torch.float64),
        "sh0": torch.randn(n, 1, 3, generator=g, dtype=torch.float64),
    })


def _grow(params, ids, grads, step=9):
    """DefaultStrategy's growth on these Gaussians; returns ids and parameters sorted by id."""
    p = torch.nn.ParameterDict({k: torch.nn.Parameter(v.detach().clone()) for k, v in params.items()})
    optimizers = {k: torch.optim.Adam([v], lr=1e-3) for k, v in p.items()}
    strategy = DefaultStrategy(grow_grad2d=0.5, grow_scale3d=0.1)
    state = strategy.initialize_state(scene_scale=1.0, seed=4)
    state.update(grad2d=grads.clone(), count=torch.ones(len(ids)), uid=ids.clone())
    n_dupli, n_split = strategy._grow_gs(p, optimizers, state, step)
    assert len(state["uid"]) == len(p["means"]) == len(ids) + n_dupli + n_split
    order = torch.argsort(state["uid"])
    return n_dupli, n_split, state["uid"][order], {k: v.detach()[order] for k, v in p.items()}


@pytest.mark.parametrize("chunks", [2, 3])
def test_growth_by_id_is_the_same_whichever_rank_and_order(chunks):
    """Growth of all Gaussians at once (W=1) and of `chunks` shuffled pieces (W ranks)
    gives the same Gaussians: the same ids, the same children at the same places."""
    strategy_ops.install()
    n = 120
    params = _params(n)
    with torch.no_grad():
        params["scales"][:40] = math.log(0.02)  # small: duplicated when the gradient is high
    grads = (torch.arange(n) % 3 == 0).double()  # high on every third: duplicates and splits
    ids = initial_ids((1000, 1000 + n))
    n_dupli, n_split, uid, whole = _grow(params, ids, grads)
    assert n_dupli > 5 and n_split > 20
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(chunks))
    pieces = [_grow({k: v.detach()[c] for k, v in params.items()}, ids[c], grads[c]) for c in perm.chunk(chunks)]
    assert sum(p[0] for p in pieces) == n_dupli and sum(p[1] for p in pieces) == n_split
    uid_c = torch.cat([p[2] for p in pieces])
    order = torch.argsort(uid_c)
    assert torch.equal(uid_c[order], uid)
    for k in whole:
        torch.testing.assert_close(torch.cat([p[3][k] for p in pieces])[order], whole[k], rtol=1e-15, atol=1e-15)
    assert (~torch.isin(uid, ids)).sum() == n_dupli + 2 * n_split  # the newborns


def test_a_state_without_ids_numbers_its_gaussians():
    """A strategy used on its own (no trainer): its Gaussians are 0..N-1 at the first
    growth, the W=1 initial ids; originals that are not split keep theirs."""
    strategy_ops.install()
    params = _params(30)
    small = torch.exp(params["scales"]).max(dim=-1).values <= 0.1  # duplicated; the others split
    optimizers = {k: torch.optim.Adam([v], lr=1e-3) for k, v in params.items()}
    strategy = DefaultStrategy(grow_grad2d=0.5, grow_scale3d=0.1)
    state = strategy.initialize_state(scene_scale=1.0)
    state.update(grad2d=torch.ones(30), count=torch.ones(30))
    assert state["uid"] is None
    strategy._grow_gs(params, optimizers, state, step=3)
    uid = state["uid"]
    assert len(uid) == len(params["means"]) == 30 + int(small.sum()) + int((~small).sum())
    assert torch.equal(uid[torch.isin(uid, torch.arange(30))], torch.where(small)[0])
    assert len(uid.unique()) == len(uid)
