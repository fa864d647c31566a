"""Our PLY as a third-party tool reads it (issue 32): PlayCanvas' splat-transform (npm
@playcanvas/splat-transform, the converter behind SuperSplat) converts a PLY written the way
a 2-rank run writes its merged file (export.create_ply + write_ply_rows, one chunk per rank)
to .ply, .spz and .compressed.ply and back, and every splat comes back with its values within
what each format's quantisation allows; and its rotate/scale/translate of our PLY equals our
own coords.to_capture (the --ply_frame capture transform) of the same similarity, SH
coefficients included: the two agree on the layout (channel-major f_rest, (w, x, y, z)
quaternions, log scales) and on what rotating a splat means.

Skipped, with the reason, when node/npx are absent or the package cannot be fetched (npm
offline). The package is pinned (its tolerances are those of its formats at that version) and
fetched once into npm's cache (~57 MB with its dependencies), then used offline."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict

import numpy as np
import pytest
import torch

from distsplat.train.files.coords import to_capture
from distsplat.train.files.export import create_ply, ply_rows, write_ply_rows

pytestmark = pytest.mark.slow

PACKAGE = "@playcanvas/splat-transform@2.7.1"
# npm's own defaults retry for minutes on a dead network: fail fast instead, and keep quiet.
NPM_ENV = {"npm_config_fetch_retries": "0", "npm_config_fetch_timeout": "20000", "npm_config_update_notifier": "false",
           "npm_config_fund": "false", "npm_config_audit": "false", "npm_config_yes": "true"}
N = 600  # more than two of compressed.ply's 256-splat chunks
SH_C0 = 0.28209479177387814


def splat_transform(cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["npx", "--yes", "--prefer-offline", PACKAGE, "-w", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **NPM_ENV})


@pytest.fixture(scope="module")
def tool(tmp_path_factory) -> Path:
    """A work folder where splat-transform runs; skips when node/npx or the package is missing."""
    missing = [name for name in ("node", "npx") if shutil.which(name) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not found: the splat-transform interop test needs Node.js")
    cwd = tmp_path_factory.mktemp("splat_transform")
    try:
        p = subprocess.run(["npx", "--yes", "--prefer-offline", PACKAGE, "--version"], cwd=cwd, capture_output=True,
                           text=True, timeout=180, env={**os.environ, **NPM_ENV})
    except subprocess.TimeoutExpired:
        pytest.skip(f"npx could not fetch {PACKAGE} within 180 s (npm registry unreachable?)")
    if p.returncode != 0:  # npm's first error line that says something (FetchError: ...), else its last
        lines = [line.strip() for line in (p.stderr + p.stdout).splitlines() if line.strip()]
        why = next((x for x in lines if "Error" in x or "ERR!" in x), lines[-1] if lines else "no output")
        pytest.skip(f"npx could not fetch or run {PACKAGE} (npm registry unreachable?): {why[:200]}")
    return cwd


def trained_like(n: int, sh_degree: int = 3, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Parameters in the ranges a trained scene holds (raw, as the PLY stores them), inside every
    format's range: SPZ's positions |x| < 2048, log scales in [-10, 6], DC in +-3.3, SH in +-1."""
    g = torch.Generator().manual_seed(seed)
    k = (sh_degree + 1) ** 2
    return {
        "means": torch.rand(n, 3, generator=g) * 4 - 2,
        "scales": torch.rand(n, 3, generator=g) * 4 - 6,  # log scales
        "quats": torch.randn(n, 4, generator=g),  # unnormalised, as trained
        "opacities": torch.randn(n, generator=g) * 2,  # logits
        "sh0": torch.randn(n, 1, 3, generator=g) * 0.8,
        "shN": (torch.rand(n, k - 1, 3, generator=g) * 2 - 1) * 0.5,
    }


def write_as_two_ranks(path: Path, params: Dict[str, torch.Tensor]) -> None:
    rows = ply_rows(params)
    header = create_ply(path, rows.shape[0], params["shN"].shape[1])
    half = rows.shape[0] // 2
    write_ply_rows(path, header, half, rows[half:])  # rank 1's chunk, before rank 0's: no order assumed
    write_ply_rows(path, header, 0, rows[:half])


def read_ply(path: Path) -> Dict[str, np.ndarray]:
    plyfile = pytest.importorskip("plyfile")  # a dev dependency: an independent reader
    v = plyfile.PlyData.read(str(path))["vertex"]
    return {name: np.asarray(v[name], np.float64) for name in v.data.dtype.names}


def matched(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray], tol: float) -> Dict[str, np.ndarray]:
    """b's splats in a's order: compressed.ply sorts them into chunks. Each of a's splats takes
    b's nearest one, which must be a permutation (splats are ~0.5 apart, errors < tol)."""
    from scipy.spatial import cKDTree

    pa = np.stack([a[c] for c in "xyz"], 1)
    pb = np.stack([b[c] for c in "xyz"], 1)
    dist, idx = cKDTree(pb).query(pa)
    assert dist.max() < tol and len(np.unique(idx)) == len(idx), "splats lost, merged or moved"
    return {k: v[idx] for k, v in b.items()}


def unit_quats(d: Dict[str, np.ndarray]) -> np.ndarray:
    q = np.stack([d[f"rot_{i}"] for i in range(4)], 1)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def check(a, b, pos, log_scale, alpha, dc, quat, rest) -> None:
    """Every value within its tolerance; pos / log_scale / dc / rest may be per-axis or per-band."""
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    for i, c in enumerate("xyz"):
        assert np.abs(a[c] - b[c]).max() <= np.broadcast_to(pos, 3)[i], c
        assert np.abs(a[f"scale_{i}"] - b[f"scale_{i}"]).max() <= np.broadcast_to(log_scale, 3)[i], f"scale_{i}"
        assert np.abs(a[f"f_dc_{i}"] - b[f"f_dc_{i}"]).max() <= dc, f"f_dc_{i}"
    assert np.abs(sig(a["opacity"]) - sig(b["opacity"])).max() <= alpha, "opacity"
    qa, qb = unit_quats(a), unit_quats(b)
    qb *= np.sign((qa * qb).sum(1, keepdims=True))  # q and -q are one rotation
    assert np.abs(qa - qb).max() <= quat, "rotation"
    for i in range(45):  # channel-major: coefficient i % 15 of channel i // 15
        band = 1 if i % 15 < 3 else 2 if i % 15 < 8 else 3
        assert np.abs(a[f"f_rest_{i}"] - b[f"f_rest_{i}"]).max() <= rest[band], f"f_rest_{i}"


def test_splat_transform_reads_our_ply_and_every_format_round_trips(tool):
    write_as_two_ranks(tool / "ours.ply", trained_like(N))
    ours = read_ply(tool / "ours.ply")
    assert len(ours["x"]) == N
    eps = 1e-5  # float32 arithmetic on top of each quantisation step

    # .ply -> .ply: every property kept, every float copied
    p = splat_transform(tool, "ours.ply", "copy.ply")
    assert p.returncode == 0, p.stderr[-2000:]
    copy = read_ply(tool / "copy.ply")
    assert set(copy) == set(ours)
    assert all(np.array_equal(copy[k], ours[k]) for k in copy), "a float changed in a plain PLY round trip"

    # .spz (Niantic's format, written by its own library): positions in 24-bit fixed point with
    # 12 fractional bits (rounded: 2^-13), log scales (s + 10) * 16 in 8 bits (1/32), alpha in 8
    # bits (0.5/255), DC as 0.5 + 0.15 * dc in 8 bits (0.5 / (0.15 * 255)), rotations as the
    # smallest three in 9 bits + sign with the largest rebuilt (< 2e-3), SH (sh * 128 + 128)
    # in 8 bits rounded to 5 bits for band 1 and 4 bits above ((4 + 0.5) / 128, (8 + 0.5) / 128)
    for args in (("ours.ply", "ours.spz"), ("ours.spz", "spz.ply")):
        p = splat_transform(tool, *args)
        assert p.returncode == 0, p.stderr[-2000:]
    spz = read_ply(tool / "spz.ply")
    assert len(spz["x"]) == N
    check(ours, spz, pos=2.0**-13 + eps, log_scale=1 / 32 + eps, alpha=0.5 / 255 + eps,
          dc=0.5 / (0.15 * 255) + eps, quat=2e-3, rest={1: 4.5 / 128 + eps, 2: 8.5 / 128 + eps, 3: 8.5 / 128 + eps})

    # .compressed.ply (PlayCanvas/SuperSplat): chunks of 256 splats, each with its own bounds;
    # positions and log scales in 11/10/11 bits and colour (0.5 + C0 * dc) in 8 bits across the
    # chunk's range (at most the whole cloud's: half a step of it), alpha in 8 bits, rotations
    # as the smallest three in 10 bits, SH in 8 bits over [-4, 4] (4/255)
    for args in (("ours.ply", "ours.compressed.ply"), ("ours.compressed.ply", "compressed.ply")):
        p = splat_transform(tool, *args)
        assert p.returncode == 0, p.stderr[-2000:]
    packed = read_ply(tool / "compressed.ply")
    assert len(packed["x"]) == N

    def half_step(keys, bits):
        return np.array([(ours[k].max() - ours[k].min()) / (2**b - 1) / 2 for k, b in zip(keys, bits)]) + eps

    dc_range = max(ours[f"f_dc_{i}"].max() - ours[f"f_dc_{i}"].min() for i in range(3))
    pos = half_step("xyz", (11, 10, 11))
    check(ours, matched(ours, packed, np.linalg.norm(pos)), pos=pos,
          log_scale=half_step([f"scale_{i}" for i in range(3)], (11, 10, 11)), alpha=0.5 / 255 + eps,
          dc=dc_range / 255 / 2 + eps, quat=2e-3, rest={1: 4 / 255 + eps, 2: 4 / 255 + eps, 3: 4 / 255 + eps})


def test_splat_transforms_rotation_of_our_ply_is_our_capture_transform(tool):
    params = trained_like(N, seed=1)
    write_as_two_ranks(tool / "ours1.ply", params)
    p = splat_transform(tool, "ours1.ply", "-r", "30,-50,70", "-s", "2", "-t", "0.5,-1,2", "moved.ply")
    assert p.returncode == 0, p.stderr[-2000:]
    moved = read_ply(tool / "moved.ply")
    assert len(moved["x"]) == N
    # The similarity it applied, x' = M x, fitted from the positions (we need not know its Euler
    # convention); to_capture(params, T) maps x to T^-1 x, so T = M^-1 should give its file.
    src = params["means"].double().numpy()
    dst = np.stack([moved[c] for c in "xyz"], 1)
    A = np.linalg.lstsq(np.c_[src, np.ones(N)], dst, rcond=None)[0]  # [4, 3]
    M = np.eye(4)
    M[:3, :3], M[:3, 3] = A[:3].T, A[3]
    assert np.linalg.norm(M[:3, 0]) == pytest.approx(2, abs=1e-6)
    ours = to_capture({k: v.double() for k, v in params.items()}, np.linalg.inv(M))
    got = {
        "means": dst,
        "scales": np.stack([moved[f"scale_{i}"] for i in range(3)], 1),
        "opacities": moved["opacity"],
        "sh0": np.stack([moved[f"f_dc_{i}"] for i in range(3)], 1).reshape(N, 1, 3),
        "shN": np.stack([moved[f"f_rest_{i}"] for i in range(45)], 1).reshape(N, 3, 15).transpose(0, 2, 1),
    }
    tol = 2e-5  # float32 files of values up to ~6 (the means): a few float32 steps
    for k, v in got.items():
        assert np.abs(ours[k].numpy() - v).max() < tol, k
    qa = ours["quats"].numpy() / np.linalg.norm(ours["quats"].numpy(), axis=1, keepdims=True)
    qb = unit_quats(moved)
    qb *= np.sign((qa * qb).sum(1, keepdims=True))
    assert np.abs(qa - qb).max() < tol
    # a real rotation of the SH, not an identity both sides agree on
    assert np.abs(got["shN"] - params["shN"].numpy()).max() > 0.1
