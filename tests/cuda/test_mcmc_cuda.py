"""MCMC relocation on CUDA: gsplat's relocation kernel against our CPU path for it
(strategy_ops.relocation_torch, float64), and one relocation step of our MCMCStrategy on
CUDA parameters checked Gaussian by Gaussian against that CPU path. Needs a GPU.

The tolerances are bounds on the kernel's float32 rounding (its source:
gsplat/cuda/csrc/RelocationCUDA.cu, built with fast maths):
- new opacity = 1 - powf(1 - o, 1/n): powf = exp2(y * log2 x) is off by at most about
  2^-22 of 1 (log2's absolute error times y <= 1, plus exp2's 2 ulps), and 1 - r is exact,
  so |error| <= A = 2^-20 (a factor 2 over 2^-21 for the rounding of 1 - o and 1/n);
- new scale = o / denom * s, denom = sum_{i<=n, k<i} C(i-1, k) (-1)^k / sqrt(k+1) x^(k+1):
  each of the n(n+1)/2 terms is off relatively by e_k (pow(x, k+1) as exp2((k+1) log2 x):
  ln2 (k+1) |error of log2 x| + 2 ulps, plus 4 roundings), the float32 sum adds at most
  n(n+1)/2 * 2^-24 of the sum of |terms|, and the error A of x moves denom by
  |denom'(x)| A. Their sum over |denom|, plus 3 roundings, bounds the relative error of the
  scale; the test allows twice that bound (second-order terms).
"""

import math

import pytest
import torch

from distsplat.train.model.strategy_ops import install, relocation_torch

pytestmark = pytest.mark.cuda

U = 2.0 ** -24  # float32 unit roundoff
A = 2.0 ** -20  # bound on the kernel's new-opacity error (module docstring)
N_MAX = 51  # gsplat's MCMCStrategy binomial table size


def _binoms(device="cpu"):
    b = torch.zeros(N_MAX, N_MAX)  # float32, exactly as gsplat's MCMCStrategy builds it
    for n in range(N_MAX):
        for k in range(n + 1):
            b[n, k] = math.comb(n, k)
    return b.to(device)


def _scale_rel_tol(o: torch.Tensor, n: torch.Tensor, binoms: torch.Tensor) -> torch.Tensor:
    """[N] bound on the kernel's relative scale error (module docstring), in float64."""
    b = binoms.double().cpu()
    out = torch.empty(len(o), dtype=torch.float64)
    for j, (oj, nj) in enumerate(zip(o.double().tolist(), n.tolist())):
        x = 1.0 - (1.0 - oj) ** (1.0 / nj)
        log2x = abs(math.log2(x))
        d_log2 = max(2.0 ** -22, 2 * U * log2x)  # __log2f: absolute in [0.5, 2], else 2 ulps
        denom = d_denom = s_abs = err_terms = 0.0
        for i in range(1, nj + 1):
            for k in range(i):
                c = float(b[i - 1, k])
                t = c * x ** (k + 1) / math.sqrt(k + 1)
                denom += (-1) ** k * t
                d_denom += (-1) ** k * c * (k + 1) * x ** k / math.sqrt(k + 1)
                s_abs += t
                e_k = math.log(2) * (k + 1) * (d_log2 + U * log2x) + 2 * U + 4 * U
                err_terms += t * e_k
        m = nj * (nj + 1) / 2
        err = abs(d_denom) * A + err_terms + m * U * s_abs
        out[j] = 2 * (err / abs(denom) + 3 * U)
    return out


def test_relocation_kernel_matches_the_cpu_path():
    from gsplat.relocation import compute_relocation

    o_values = [0.005, 0.05, 0.3, 0.7, 0.95, 0.99]
    n_values = [1, 2, 3, 5, 10, 25, 51, 60]  # 60 is clamped to N_MAX like the kernel does
    o = torch.tensor([a for a in o_values for _ in n_values], dtype=torch.float32)
    ratios = torch.tensor([b for _ in o_values for b in n_values], dtype=torch.int64)
    scales = torch.rand(len(o), 3, generator=torch.Generator().manual_seed(0)) + 0.01
    binoms = _binoms()
    new_o, new_s = compute_relocation(o.cuda(), scales.cuda(), ratios.cuda().clone(), binoms.cuda())
    ref_o, ref_s = relocation_torch(o.double(), scales.double(), ratios, binoms)
    assert torch.isfinite(new_o).all() and torch.isfinite(new_s).all()
    diff_o = (new_o.cpu().double() - ref_o).abs()
    assert diff_o.max() <= A, f"new opacity off by {diff_o.max():.3g} > 2^-20"
    tol = _scale_rel_tol(o, ratios.clamp(1, N_MAX), binoms)[:, None]  # [N, 1]
    rel = (new_s.cpu().double() - ref_s).abs() / ref_s.abs()
    bad = rel > tol
    assert not bad.any(), (
        f"scales off relatively by {rel[bad].tolist()} > bounds {tol.expand_as(rel)[bad].tolist()} "
        f"at (o, n) = {[(float(o[j]), int(ratios[j])) for j in bad.any(1).nonzero()[:, 0]]}")
    # n = 1: the Gaussian keeps its opacity and scale.
    one = ratios == 1
    assert (diff_o[one] <= A).all()
    torch.testing.assert_close(new_s.cpu()[one], scales[one], rtol=2 * A / 0.005, atol=0)


def test_mcmc_relocation_step_on_cuda_agrees_with_the_cpu_path():
    """Our MCMCStrategy relocates dead Gaussians on CUDA (gsplat's kernel through the
    strategy_ops dispatcher); every dead slot becomes a copy of a live source, and the
    sources' new opacity and scale are the CPU path's for the number of copies made."""
    from distsplat.train.model.strategies import MCMCStrategy

    install()
    n, n_dead = 400, 60
    g = torch.Generator().manual_seed(0)
    raw = {
        "means": torch.randn(n, 3, generator=g),
        "scales": torch.log(torch.rand(n, 3, generator=g) * 0.1 + 0.01),
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.logit(torch.rand(n, generator=g) * 0.9 + 0.05),
        "sh0": torch.randn(n, 1, 3, generator=g),
    }
    raw["opacities"][:n_dead] = -10.0  # dead: sigmoid(-10) < min_opacity 0.005
    params = torch.nn.ParameterDict({k: torch.nn.Parameter(v.cuda()) for k, v in raw.items()})
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in params.items()}
    for p in params.values():  # one step, so the optimizers hold moments to be reset
        p.grad = torch.ones_like(p)
    for opt in optimizers.values():
        opt.step()
    before = {k: p.detach().clone() for k, p in params.items()}
    strategy = MCMCStrategy(cap_max=n)
    state = strategy.initialize_state()
    binoms = state["binoms"].cuda()
    assert strategy._relocate_gs(params, optimizers, binoms) == n_dead

    after = {k: p.detach() for k, p in params.items()}
    # Each dead slot now holds a live Gaussian's position: find its source (positions are
    # random, so a match is unique).
    match = (after["means"][:n_dead, None, :] == before["means"][None, n_dead:, :]).all(-1)  # [dead, live]
    assert (match.sum(1) == 1).all(), "every dead slot copies exactly one live Gaussian"
    src = match.float().argmax(1) + n_dead  # [dead]
    copies = torch.bincount(src, minlength=n)  # how often each source was sampled
    sources = copies.nonzero()[:, 0]
    ratio = copies[sources] + 1  # gsplat: bincount(sampled)[sampled] + 1
    o_old = torch.sigmoid(before["opacities"][sources]).cpu()
    s_old = torch.exp(before["scales"][sources]).cpu()
    ref_o, ref_s = relocation_torch(o_old.double(), s_old.double(), ratio.cpu(), binoms.cpu())
    ref_o = ref_o.clamp(strategy.min_opacity, 1 - torch.finfo(torch.float32).eps)
    # logit -> sigmoid and log -> exp round trips add a few float32 roundings each (exp of
    # log s, |log s| < 5: about 5 * 2 ulps relative).
    got_o = torch.sigmoid(after["opacities"][sources]).cpu().double()
    assert (got_o - ref_o).abs().max() <= A + 8 * U
    tol = _scale_rel_tol(o_old, ratio.cpu().clamp(1, N_MAX), binoms)[:, None] + 32 * U
    got_s = torch.exp(after["scales"][sources]).cpu().double()
    assert ((got_s - ref_s).abs() / ref_s <= tol).all()
    for k in ("opacities", "scales", "means", "quats", "sh0"):  # the copies equal their source
        torch.testing.assert_close(after[k][:n_dead], after[k][src], atol=0, rtol=0)
    untouched = torch.ones(n, dtype=torch.bool, device="cuda")
    untouched[:n_dead] = False
    untouched[sources] = False
    for k in raw:
        assert torch.equal(after[k][untouched], before[k][untouched]), k
    for k, opt in optimizers.items():  # sources' moments reset, the others kept
        st = opt.state[params[k]]
        assert (st["exp_avg"][sources] == 0).all() and (st["exp_avg"][untouched] != 0).all(), k
