"""PLY export in the standard 3DGS layout (x y z nx ny nz f_dc_* f_rest_* opacity scale_*
rot_*), readable by common splat viewers.

Every Gaussian is one fixed-size little-endian float32 record, so the merged file of a
distributed run needs no gather: rank 0 writes the header and sizes the file, then each
rank writes its own contiguous chunk at `header + start * record_size` (`write_ply_rows`).
Values are the raw (pre-activation) parameters, as 3DGS stores them: log scales, logit
opacities, unnormalized quaternions (w, x, y, z), SH coefficients with f_rest laid out
channel-major (all of red's coefficients, then green's, then blue's)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Dict, List, Union

import numpy as np
from torch import Tensor

PathLike = Union[str, os.PathLike]


def ply_fields(sh_rest: int) -> List[str]:
    """Property names for Gaussians with sh_rest = K - 1 higher-order SH coefficients."""
    return (
        ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
        + [f"f_rest_{i}" for i in range(3 * sh_rest)]
        + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    )


def ply_header(n: int, sh_rest: int) -> bytes:
    lines = ["ply", "format binary_little_endian 1.0", f"element vertex {n}"]
    lines += [f"property float {name}" for name in ply_fields(sh_rest)]
    lines.append("end_header")
    return ("\n".join(lines) + "\n").encode("ascii")


def ply_rows(params: Dict[str, Tensor]) -> np.ndarray:
    """Raw parameters (means [N,3], scales [N,3] log, quats [N,4], opacities [N] logit,
    sh0 [N,1,3], shN [N,K-1,3]) -> float32 records [N, F] in PLY property order."""
    means = params["means"].detach().float().cpu().numpy()
    n = means.shape[0]
    sh0 = params["sh0"].detach().float().cpu().reshape(n, 3).numpy()
    shN = params["shN"].detach().float().cpu()  # [N, K-1, 3]
    f_rest = shN.transpose(1, 2).reshape(n, -1).numpy()  # channel-major, as 3DGS
    cols = [
        means, np.zeros((n, 3), np.float32), sh0, f_rest,
        params["opacities"].detach().float().cpu().reshape(n, 1).numpy(),
        params["scales"].detach().float().cpu().numpy(),
        params["quats"].detach().float().cpu().numpy(),
    ]
    return np.ascontiguousarray(np.concatenate(cols, axis=1), dtype="<f4")


def create_ply(path: PathLike, n_total: int, sh_rest: int) -> int:
    """Writes the header and sizes the file for n_total Gaussians; returns the header size."""
    header = ply_header(n_total, sh_rest)
    record = 4 * len(ply_fields(sh_rest))
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + n_total * record)
    return len(header)


def write_ply_rows(path: PathLike, header_size: int, start: int, rows: np.ndarray) -> None:
    """Writes records for Gaussians start .. start + len(rows) into a file from create_ply."""
    fd = os.open(path, os.O_WRONLY)
    try:
        data = rows.tobytes()
        offset, done = header_size + start * rows.shape[1] * 4, 0
        while done < len(data):
            n = os.pwrite(fd, data[done:], offset + done)
            if n == 0:  # a short write that makes no progress: the disk is full (disk_full.py)
                raise OSError(errno.ENOSPC, f"short write: {done} of {len(data)} bytes written, then none", str(path))
            done += n
        os.fsync(fd)
    finally:
        os.close(fd)


def write_ply(path: PathLike, params: Dict[str, Tensor]) -> Path:
    """One process: writes all Gaussians of params to path, atomically (tmp + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ply_rows(params)
    tmp = path.with_name(path.name + ".tmp")
    header_size = create_ply(tmp, rows.shape[0], params["shN"].shape[1])
    write_ply_rows(tmp, header_size, 0, rows)
    os.replace(tmp, path)
    return path
