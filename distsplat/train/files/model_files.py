"""Models written by other trainers, and ours in their formats (issue 46, point 2): gsplat's
checkpoint `.pt` files and 3DGS PLY files, read by global row range so that each rank loads only
its chunk (docs/design.md: a Gaussian lives on one rank), and gsplat's `.pt` written.

gsplat 1.5.3's trainer saves `{"step": step, "splats": splats.state_dict()}` to
`R/ckpts/ckpt_{step}_rank{r}.pt`, one file per rank in its distributed mode (each rank's own
Gaussians), and reads a list of them back by concatenating every tensor in the list's order:
that concatenation is the model here too. `splats` holds the raw parameters: means [N, 3],
scales [N, 3] (log), quats [N, 4] (w, x, y, z), opacities [N] (logit), sh0 [N, 1, 3], shN
[N, K-1, 3] (with --app_opt features and colours instead, which distsplat does not read).

A PLY is one `vertex` element of fixed-size binary records (little- or big-endian, any
numeric property types, in any order): x y z, f_dc_0..2, f_rest_* (channel-major, as 3DGS
writes them), opacity, scale_0..2, rot_0..3 are read, anything else (normals, colours) is
ignored: the original 3DGS implementation's files (with normals), gsplat's `export_splats`
(without) and ours alike. Files are read by offset, so a rank reads its rows only.

Every problem is a ValueError naming the flag and the file and what to pass instead, the same
on every rank that reads it (the trainer's setup agreement makes every rank raise it)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

KEYS = ("means", "scales", "quats", "opacities", "sh0", "shN")  # gsplat's splats, in its order
_PER_RANK = re.compile(r"ckpt_(\d+)_rank(\d+)\.pt")  # gsplat's distributed checkpoint names


# ------------------------------------------------------------------------------------- PLY
_PLY_TYPES = {"char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1", "short": "i2", "int16": "i2",
              "ushort": "u2", "uint16": "u2", "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
              "float": "f4", "float32": "f4", "double": "f8", "float64": "f8"}
_HEADER_MAX = 1 << 16


@dataclass(frozen=True)
class PlyLayout:
    """A 3DGS PLY's vertex records: their count, property names in file order, the header's
    size in bytes and the numpy record type."""

    n: int
    names: List[str]
    header_bytes: int
    dtype: np.dtype

    @property
    def sh_rest(self) -> int:
        """Higher-order SH coefficients per channel (K - 1)."""
        return sum(name.startswith("f_rest_") for name in self.names) // 3


def read_ply_layout(path: Path, flag: str = "--ckpt") -> PlyLayout:
    """The layout of a binary 3DGS PLY; ValueError naming `flag` and the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{flag} {path}: no such PLY file")
    with open(path, "rb") as f:
        head = f.read(_HEADER_MAX)
    end = head.find(b"end_header")
    if not head.startswith(b"ply") or end < 0:
        raise ValueError(f"{flag} {path}: not a PLY file (no 'ply' magic or no 'end_header' in its first 64 KiB)")
    eol = head.find(b"\n", end)
    if eol < 0:
        raise ValueError(f"{flag} {path}: the PLY header's end_header line is cut off")
    n: Optional[int] = None
    order, fields, in_vertex, seen_vertex = "<", [], False, False
    for line in head[:end].decode("ascii", "replace").splitlines()[1:]:
        parts = line.split()
        if not parts or parts[0] in ("comment", "obj_info"):
            continue
        if parts[0] == "format":
            if parts[1:2] == ["binary_little_endian"]:
                order = "<"
            elif parts[1:2] == ["binary_big_endian"]:
                order = ">"
            else:
                raise ValueError(f"{flag} {path}: PLY format {' '.join(parts[1:2]) or '(none)'} is not read; "
                                 "write it as binary (binary_little_endian), as 3DGS trainers do")
        elif parts[0] == "element":
            if len(parts) < 3 or not parts[2].isdigit():
                raise ValueError(f"{flag} {path}: malformed PLY header line {line!r}")
            if parts[1] == "vertex":
                if seen_vertex:
                    raise ValueError(f"{flag} {path}: the PLY has two vertex elements")
                n, in_vertex, seen_vertex = int(parts[2]), True, True
            elif not seen_vertex:
                raise ValueError(f"{flag} {path}: the PLY's element {parts[1]!r} comes before its vertices; "
                                 "3DGS PLYs hold the Gaussians as the first element")
            else:
                in_vertex = False  # elements after the vertices (faces, ...) are ignored
        elif parts[0] == "property" and in_vertex:
            if len(parts) != 3 or parts[1] not in _PLY_TYPES:
                raise ValueError(f"{flag} {path}: PLY vertex property {line.strip()!r} is not a number "
                                 f"({', '.join(sorted(set(_PLY_TYPES)))}); 3DGS PLYs hold float properties")
            fields.append((parts[2], order + _PLY_TYPES[parts[1]]))
    if n is None:
        raise ValueError(f"{flag} {path}: the PLY has no vertex element")
    names = [name for name, _ in fields]
    if len(set(names)) != len(names):
        raise ValueError(f"{flag} {path}: the PLY names a vertex property twice")
    rest = sorted(int(name[7:]) for name in names if re.fullmatch(r"f_rest_\d+", name))
    need = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1", "scale_2",
            "rot_0", "rot_1", "rot_2", "rot_3"]
    missing = [name for name in need if name not in names]
    if missing or rest != list(range(len(rest))) or len(rest) % 3 or int(round((len(rest) // 3 + 1) ** 0.5)) ** 2 \
            != len(rest) // 3 + 1:
        raise ValueError(f"{flag} {path}: not a 3D Gaussian splatting PLY (it needs x y z f_dc_0..2 opacity "
                         f"scale_0..2 rot_0..3 and 3 (degree+1)^2 - 3 f_rest_*; "
                         f"{'missing ' + ' '.join(missing) if missing else f'{len(rest)} f_rest_* properties'})")
    layout = PlyLayout(n, names, eol + 1, np.dtype(fields))
    size = path.stat().st_size
    if size < layout.header_bytes + n * layout.dtype.itemsize:  # before reading: the count must match the file
        raise ValueError(f"{flag} {path}: the PLY header announces {n} Gaussians ({n * layout.dtype.itemsize} "
                         f"bytes), the file holds {max(size - layout.header_bytes, 0)} bytes after its header: "
                         "truncated or damaged")
    return layout


def read_ply_rows(path: Path, start: int, end: int, flag: str = "--ckpt",
                  layout: Optional[PlyLayout] = None) -> Dict[str, Tensor]:
    """Rows [start, end) of a 3DGS PLY as raw float32 parameters (KEYS; the inverse of
    export.ply_rows), read from their offset in the file."""
    layout = layout or read_ply_layout(path, flag)
    if not 0 <= start <= end <= layout.n:
        raise ValueError(f"{flag} {path}: rows [{start}, {end}) are not all in the PLY's {layout.n}")
    rec = np.fromfile(path, dtype=layout.dtype, count=end - start, offset=layout.header_bytes
                      + start * layout.dtype.itemsize)

    def cols(*names: str) -> Tensor:
        if not names:
            return torch.zeros(len(rec), 0)
        return torch.from_numpy(np.stack([rec[name].astype(np.float32) for name in names], axis=1))

    k1 = layout.sh_rest
    rest = cols(*(f"f_rest_{i}" for i in range(3 * k1)))  # [N, 3 (K-1)], channel-major on disk
    return {
        "means": cols("x", "y", "z"),
        "scales": cols("scale_0", "scale_1", "scale_2"),
        "quats": cols("rot_0", "rot_1", "rot_2", "rot_3"),
        "opacities": cols("opacity")[:, 0].contiguous(),
        "sh0": cols("f_dc_0", "f_dc_1", "f_dc_2").reshape(-1, 1, 3),
        "shN": rest.reshape(len(rec), 3, k1).transpose(1, 2).contiguous(),
    }


# -------------------------------------------------------------------------- gsplat's .pt
def split_files(spec: str) -> List[str]:
    """The files of a --ckpt value: gsplat's list (`--ckpt a.pt b.pt` reaches the config as
    one value joined by os.pathsep, gsplat_flags.py) or one path."""
    return [p for p in str(spec).split(os.pathsep) if p]


def is_gsplat_spec(spec: Optional[str]) -> bool:
    """Whether a --ckpt value names gsplat checkpoint files (.pt) rather than a distsplat
    checkpoint directory or a PLY."""
    return spec is not None and all(p.lower().endswith(".pt") for p in split_files(spec))


def is_ply_spec(spec: Optional[str]) -> bool:
    files = split_files(spec) if spec is not None else []
    return len(files) == 1 and files[0].lower().endswith(".ply")


def gsplat_files(spec: str, flag: str = "--ckpt") -> List[Path]:
    """The .pt files of a --ckpt value, in gsplat's order (the list's). One file of gsplat's
    distributed mode (ckpt_STEP_rankR.pt) brings its step's other ranks' files beside it, in
    rank order: alone it holds 1/W of the model. A list that names some ranks of a step but
    not others is refused (gsplat would load a part of the model)."""
    files = [Path(p) for p in split_files(spec)]
    for p in files:
        if not p.is_file():
            raise ValueError(f"{flag} {p}: no such file (gsplat writes its checkpoints to "
                             "R/ckpts/ckpt_STEP_rankR.pt)")
    if len(files) == 1:
        m = _PER_RANK.fullmatch(files[0].name)
        if m:
            return _ranks_of(files[0].parent, m[1])
        return files
    ranked = {(p.parent, m[1]) for p in files for m in [_PER_RANK.fullmatch(p.name)] if m}
    for parent, step in sorted(ranked):
        every = _ranks_of(parent, step)
        passed = {p.name for p in files if p.parent == parent}
        absent = [q.name for q in every if q.name not in passed]
        if absent:
            raise ValueError(f"{flag}: gsplat's run wrote {len(every)} rank files for step {step} in {parent}, "
                             f"and {', '.join(absent)} {'is' if len(absent) == 1 else 'are'} not among the files "
                             "passed: the model would miss their Gaussians; pass every rank's file, or one of them "
                             "(the others beside it are read too)")
    return files


def _ranks_of(folder: Path, step: str) -> List[Path]:
    found = {}
    for p in folder.iterdir():
        m = _PER_RANK.fullmatch(p.name)
        if m and m[1] == step:
            found[int(m[2])] = p
    return [found[r] for r in sorted(found)]


def _load(path: Path, flag: str) -> Dict:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        raise ValueError(f"{flag} {path}: not a readable gsplat checkpoint ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200] if str(e) else ''}); gsplat's trainer writes "
                         "{'step': ..., 'splats': ...} to R/ckpts/ckpt_STEP_rankR.pt") from None
    if not isinstance(data, dict) or not isinstance(data.get("splats"), dict):
        raise ValueError(f"{flag} {path}: not a gsplat checkpoint (no 'splats' dict of the Gaussians' tensors; "
                         "a distsplat checkpoint is a folder R/ckpts/step_N: pass that)")
    splats = data["splats"]
    if "features" in splats or "colors" in splats:
        raise ValueError(f"{flag} {path}: a gsplat --app_opt checkpoint (appearance features and gsplat's "
                         "appearance module): distsplat reads gsplat's SH models only; export its PLY with gsplat "
                         "(--save_ply bakes the colours) and pass that")
    missing = [k for k in KEYS if not isinstance(splats.get(k), Tensor)]
    if missing:
        raise ValueError(f"{flag} {path}: the gsplat checkpoint's splats lack {', '.join(missing)}")
    n = splats["means"].shape[0]
    shapes = {"means": (n, 3), "scales": (n, 3), "quats": (n, 4), "opacities": (n,), "sh0": (n, 1, 3)}
    for k, shape in shapes.items():
        if tuple(splats[k].shape) != shape:
            raise ValueError(f"{flag} {path}: splats[{k!r}] is {list(splats[k].shape)}, expected {list(shape)}")
    shN = splats["shN"]
    if shN.dim() != 3 or shN.shape[0] != n or shN.shape[2] != 3 or int(round((shN.shape[1] + 1) ** 0.5)) ** 2 \
            != shN.shape[1] + 1:
        raise ValueError(f"{flag} {path}: splats['shN'] is {list(shN.shape)}, expected [N, (degree+1)^2 - 1, 3]")
    step = data.get("step", 0)
    if isinstance(step, Tensor):
        step = int(step)
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"{flag} {path}: its step {step!r} is not a step number")
    return {"step": step, "splats": splats}


@dataclass
class ModelFile:
    """A model read by global row range: gsplat's .pt files (concatenated in order) or a PLY."""

    kind: str  # "gsplat" or "ply"
    files: List[Path]
    counts: List[int]  # Gaussians in each file
    step: int  # gsplat's saved step (its Gaussians after that many updates); 0 for a PLY
    sh_rest: int  # K - 1
    flag: str
    _layout: Optional[PlyLayout] = None

    @property
    def n_all(self) -> int:
        return sum(self.counts)

    def describe(self) -> str:
        if len(self.files) == 1:
            return str(self.files[0])
        return f"{len(self.files)} files ({self.files[0].name} .. {self.files[-1].name} in {self.files[0].parent})"

    def rows(self, start: int, end: int) -> Dict[str, Tensor]:
        """Global rows [start, end) (raw float32 parameters, KEYS)."""
        if self.kind == "ply":
            return read_ply_rows(self.files[0], start, end, self.flag, self._layout)
        pieces, at = [], 0
        for path, n in zip(self.files, self.counts):
            a, b = max(start - at, 0), min(end - at, n)
            if a < b or (not pieces and path == self.files[-1]):
                splats = _load(path, self.flag)["splats"]
                pieces.append({k: splats[k][a:max(a, b)].float().clone() for k in KEYS})
            at += n
        return {k: torch.cat([p[k] for p in pieces]) for k in KEYS}


def open_model(spec: str, flag: str = "--ckpt") -> ModelFile:
    """The model of a --ckpt / --init_ply value: gsplat .pt files (gsplat_files) or a PLY;
    checks every file's header (its tensors are read by `rows`)."""
    if is_ply_spec(spec):
        layout = read_ply_layout(Path(spec), flag)
        return ModelFile("ply", [Path(spec)], [layout.n], 0, layout.sh_rest, flag, layout)
    if not is_gsplat_spec(spec):
        raise ValueError(f"{flag} {spec}: expected gsplat checkpoint files (.pt) or a 3DGS PLY (.ply)")
    files = gsplat_files(spec, flag)
    loaded = [_load(p, flag) for p in files]
    steps = sorted({d["step"] for d in loaded})
    if len(steps) > 1:
        raise ValueError(f"{flag}: the files hold different steps ({', '.join(map(str, steps))}): pass the files "
                         "of one step")
    rests = sorted({d["splats"]["shN"].shape[1] for d in loaded})
    if len(rests) > 1:
        raise ValueError(f"{flag}: the files hold colours of different SH degrees; pass the files of one run")
    return ModelFile("gsplat", files, [d["splats"]["means"].shape[0] for d in loaded], steps[0], rests[0], flag)


def write_gsplat_pt(path: Path, params: Dict[str, Tensor], step: int) -> Path:
    """gsplat 1.5.3's checkpoint layout, {"step": step, "splats": {KEYS: raw tensors}}, as its
    trainer saves `splats.state_dict()` (atomically: tmp + rename). gsplat's trainer,
    simple_viewer.py and tools read it; a list of such files is one model (concatenated)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    splats = {k: params[k].detach().float().cpu().contiguous() for k in KEYS}
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"step": int(step), "splats": splats}, tmp)
    os.replace(tmp, path)
    return path


def gsplat_name(step: int, rank: int) -> str:
    """gsplat's checkpoint file name. Its number, like the file's "step", is the updates the
    Gaussians have had (gsplat saves in loop iteration s, before its update: s updates done),
    which is what distsplat's step numbers count: step 7000 is ckpt_7000_rank0.pt."""
    return f"ckpt_{step}_rank{rank}.pt"


def sh_degree_of(sh_rest: int) -> int:
    return int(round((sh_rest + 1) ** 0.5)) - 1


def fit_sh(params: Dict[str, Tensor], sh_degree: int, what: str) -> Tuple[Dict[str, Tensor], Optional[str]]:
    """The model's SH coefficients for a run of `sh_degree`: fewer bands are padded with zeros
    (the higher bands start at zero, as a fresh initialisation's), more are refused (the run
    would carry coefficients it never renders). Returns the params and a note for the log."""
    have = sh_degree_of(params["shN"].shape[1])
    if have == sh_degree:
        return params, None
    if have > sh_degree:
        raise ValueError(f"{what} holds colours of SH degree {have}, this run asks for --sh_degree {sh_degree}; "
                         f"pass --sh_degree {have}")
    k1 = (sh_degree + 1) ** 2 - 1
    shN = params["shN"]
    pad = shN.new_zeros(shN.shape[0], k1 - shN.shape[1], 3)
    return ({**params, "shN": torch.cat([shN, pad], 1)},
            f"its SH degree {have} is padded to --sh_degree {sh_degree} with zero coefficients")
