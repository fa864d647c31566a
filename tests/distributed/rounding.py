"""How far float64 rounding can move training when only the world size W changes, and
which densification decisions it could flip (test_trainer.py, test_extras_training.py).

What W changes. The renders of the same parameters are bit for bit those of W = 1 (a
camera's pairs are rasterized in the global Gaussian order), and so is every per-pixel loss
gradient (a camera's loss is computed on its owner from its own image). What W changes is
the order of the sums behind a gradient: a Gaussian's gradient sums its contributions over
the pixels of every batch camera, in one backward at W = 1 and as per-rank parts at W > 1;
a shared module's (the --app_opt MLP, --pose_opt corrections, an image's embedding) sums
every pair of the batch, per rank, then all-reduces. A sum of n terms computed in another
order differs by at most n u sum|terms| (u = 2^-53, the deterministic bound, not the
sqrt(n) typical one), and with no cancellation sum|terms| is the gradient's own size.

The bound (per component, from the W = 1 run's recorded Adam steps, trainer_workers.record_adam):
    sum over steps t of  lr_t * n * u * max|g_t| / (sqrt(v_hat_t) + eps)  +  4 u |final value|
with max|g_t| the largest |gradient| of that tensor at step t (the summands' size) and Adam's
denominator what a gradient change is divided by. With densification (by Gaussian id):
  - a duplicate's copy and a split's children inherit their parent's bound;
  - a child's mean is its parent's plus R(q / |q|) diag(exp(s)) z (strategy_ops.split_with_ids),
    which moves by at most sum_j exp(s_j) |z_j| (8 sum_k |dq_k| / |q| + |ds_j|) for parent
    changes dq, ds: every entry of a rotation matrix has partial derivatives <= 4 in the unit
    quaternion's components, and normalising divides a change by |q| (times 2 from the 2-norm
    to the 1-norm); plus the rounding of that offset and sum, 8 u (|mean| + the offset's size);
  - log(exp(s) / 1.6) adds 4 u (|s| + 1) to a child's scales;
  - opacity resets clamp (never widening a difference) and zero the moments (the recorded
    denominators carry that), and pruning only removes rows.

What it assumes, and where it fails. "No cancellation": a gradient that is the cancellation
of much larger terms has rounding noise of the terms' size, which Adam (eps ~1e-15) turns
into steps of up to lr. gsplat's initial scales are isotropic, which makes every quaternion's
true gradient exactly zero: from that start the quaternions differ across W by up to ~lr,
by amounts that depend on the CPU's vector and BLAS paths, and a split carries the quaternion
difference into its children's means (R z rotates even an isotropic offset). On an AMD EPYC
that moved two children's means by 2.8 Adam steps of the means, where an Intel Xeon had
stayed within 0.1. So these tests start from anisotropic scales (trainer_workers.to_float64),
where every component has a real gradient; measured there, every parameter of every Gaussian
is within ~1e-12 Adam steps across W, a factor ~1e3 or more inside this bound.

Decisions. A grow or prune decision compares one number (mean 2D gradient, largest scale,
opacity) with a threshold; rounding can flip it only when the runs' numbers straddle the
threshold. `assert_decisions_clear` measures, for every Gaussian at every refine step, the
runs' difference in each decided number against its distance to the threshold, rather than
assuming a margin.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from distsplat.train.model.gaussians import DUPLICATE, SPLIT_A, SPLIT_B, derive_ids, normal_samples

U64 = 2.0 ** -53  # float64 unit roundoff, 1.1e-16


def step_term(adam: Dict[str, Any], t: int, n_acc: float) -> Tensor:
    """lr_t n u max|g_t| / denom_t: step t's share of the bound, per component."""
    g, denom, lr = adam["grad"][t], adam["denom"][t], float(adam["lr"][t])
    return lr * n_acc * U64 * g.abs().max() / denom


def rounding_bound(adam: Dict[str, Any], final: Tensor, n_acc: float) -> Tensor:
    """The bound of a tensor whose rows never change (no densification; shared modules)."""
    total = sum(step_term(adam, t, n_acc) for t in range(len(adam["grad"])))
    return total.reshape(final.shape) + 4 * U64 * final.abs()


def _find(keys: Tensor, wanted: Tensor) -> Tensor:
    """Index in `keys` [K] (unique) of every element of `wanted` [N]; all must be there."""
    order = torch.argsort(keys)
    pos = torch.searchsorted(keys[order], wanted).clamp_max(len(keys) - 1)
    found = order[pos]
    missing = keys[found] != wanted
    assert not missing.any(), f"{int(missing.sum())} Gaussian ids with no parent among the previous rows"
    return found


def _inherit(acc: Dict[str, Tensor], rows: Tensor, kind: Tensor, grow: Dict[str, Any] | None,
             seed: int) -> Dict[str, Tensor]:
    """The bounds of the new rows: each row's parent's (rows [N'] index the previous rows,
    kind [N']: -1 kept, else how it was born), plus what a split adds (module doc)."""
    out = {k: v[rows].clone() for k, v in acc.items()}
    split = (kind == SPLIT_A) | (kind == SPLIT_B)
    if not split.any():
        return out
    assert grow is not None
    parent = rows[split]
    z = normal_samples(seed, grow["step"], grow["uid"][parent], 6).reshape(-1, 2, 3)  # [S, 2, 3]
    z = torch.where((kind[split] == SPLIT_A)[:, None], z[:, 0], z[:, 1]).abs()  # [S, 3] this child's draw
    extent = torch.exp(grow["scales"][parent]) * z  # [S, 3] exp(s_j) |z_j|
    q = grow["quats"][parent]
    dq = acc["quats"][parent].sum(-1, keepdim=True) / q.norm(dim=-1, keepdim=True)  # [S, 1]
    moved = (extent * (8 * dq + acc["scales"][parent])).sum(-1, keepdim=True)  # [S, 1]
    rounding = 8 * U64 * (grow["means"][parent].abs() + extent.sum(-1, keepdim=True))  # [S, 3]
    out["means"][split] += moved + rounding
    out["scales"][split] += 4 * U64 * (grow["scales"][parent].abs() + 1)
    return out


def rounding_bound_by_id(run: Dict[str, Any], n_acc: float, seed: int) -> Dict[str, Tensor]:
    """The bound of every parameter of every Gaussian of a W = 1 run recorded with
    record_adam and the densification events (trainer_workers._count_events), in the rows
    of its final parameters (run["uid"])."""
    adam, grows = run["adam"], {g["step"]: g for g in run["events"].get("grow", [])}
    names = list(run["params"])
    acc = {k: torch.zeros_like(adam[k]["grad"][0]) for k in names}
    prev = adam["uid"][0]

    def realign(new: Tensor, step: int) -> None:
        nonlocal acc
        if torch.equal(new, prev):
            return
        grow = grows.get(step)
        keys, rows, kind = [prev], [torch.arange(len(prev))], [torch.full((len(prev),), -1)]
        if grow is not None:
            assert torch.equal(grow["uid"], prev), "the rows a growth saw are the step's rows"
            for k in (DUPLICATE, SPLIT_A, SPLIT_B):
                keys.append(derive_ids(prev, step, k))
                rows.append(torch.arange(len(prev)))
                kind.append(torch.full((len(prev),), k))
        at = _find(torch.cat(keys), new)
        acc = _inherit(acc, torch.cat(rows)[at], torch.cat(kind)[at], grow, seed)

    for t, uid in enumerate(adam["uid"]):
        realign(uid, t - 1)  # what step t - 1's densification did
        prev = uid
        for k in names:
            acc[k] = acc[k] + step_term(adam[k], t, n_acc)
    realign(run["uid"], len(adam["uid"]) - 1)
    return {k: acc[k] + 4 * U64 * run["params"][k].abs() for k in names}


def by_id(results: Sequence[Dict[str, Any]], fields: Dict[str, List[Tensor]] | None = None
          ) -> Tuple[Tensor, Dict[str, Tensor]]:
    """The Gaussians of all ranks as a set: ids [N_all] ascending and `fields` (default:
    the parameters) in that order."""
    uid = torch.cat([r["uid"] for r in results])
    order = torch.argsort(uid)
    fields = fields or {k: [r["params"][k] for r in results] for k in results[0]["params"]}
    return uid[order], {k: torch.cat(v)[order] for k, v in fields.items()}


def _decisions(results: Sequence[Dict[str, Any]], which: str) -> List[Dict[str, Any]]:
    """Per refine step: the decided numbers of every Gaussian of every rank, by id."""
    steps = []
    for i, first in enumerate(results[0]["events"][which]):
        recs = [r["events"][which][i] for r in results]
        uid, fields = by_id([{"uid": x["uid"]} for x in recs],
                            {k: [x[k] for x in recs] for k in ("grad", "size", "opacity") if k in first})
        steps.append({"step": first["step"], "uid": uid, "fields": fields,
                      "thr": {"grad": first.get("grad_thr"), "size": first.get("size_thr"),
                              "opacity": first.get("opacity_thr")}})
    return steps


def assert_decisions_clear(runs: Dict[int, Sequence[Dict[str, Any]]]) -> float:
    """Every grow and prune decision of the W > 1 runs was taken on numbers that sit on the
    same side of the threshold as W = 1's (measured: the runs' difference in each number
    against its distance to the threshold, for every Gaussian the runs share at that step).
    Returns the smallest distance / difference seen (inf when the numbers are equal)."""
    worst = float("inf")
    for which in ("grow", "prune_at"):
        ref = _decisions(runs[1], which)
        for W, rs in runs.items():
            if W == 1:
                continue
            other = _decisions(rs, which)
            assert [s["step"] for s in other] == [s["step"] for s in ref], (W, which)
            for a, b in zip(ref, other):
                common, ia, ib = _common(a["uid"], b["uid"])
                for k, thr in a["thr"].items():
                    if thr is None or k not in a["fields"]:
                        continue
                    x, y = a["fields"][k][ia], b["fields"][k][ib]
                    margin, diff = (x - thr).abs(), (y - x).abs()
                    flipped = (x > thr) != (y > thr)
                    assert not flipped.any(), (
                        f"W={W}: the {k} decision of Gaussian {int(common[flipped][0])} at step {a['step']} "
                        f"flipped: it is {float(margin[flipped][0]):.3g} from its threshold and the runs "
                        f"differ by {float(diff[flipped][0]):.3g}: rounding decided it (the scene, not the "
                        "code: pick another seed)")
                    near = diff > 0
                    if near.any():
                        worst = min(worst, float((margin[near] / diff[near]).min()))
    return worst


def _common(a: Tensor, b: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Ids in both ascending [N] id tensors, and their positions in each."""
    mask = torch.isin(a, b)
    common = a[mask]
    return common, torch.nonzero(mask)[:, 0], torch.searchsorted(b, common)
