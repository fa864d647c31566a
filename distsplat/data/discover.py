"""What scene descriptions a --data_dir holds, and which one is read: the step before a
parser (colmap.py, blender.py, nerfstudio.py) runs, so a capture laid out as its repository
ships it (a COLMAP model in `colmap_sparse/0` beside a colmap2nerf `transforms.json`) is
found, and the load line can say what was used and what else is there.

Looked for, in this order of preference when --data_format is auto:
- COLMAP: `sparse/0/` or `sparse/` (gsplat's places), else any folder one level down holding
  a model, or its `0/` or `sparse/0/` (e.g. `colmap_sparse/0`, `colmap/sparse/0`). A model is
  `cameras.bin|txt` + `images.bin|txt`. Preferred: it carries the SfM points;
- Blender/NeRF-synthetic: `transforms_train.json`;
- nerfstudio or instant-ngp: `transforms.json`.
Only a few stats per subfolder, never a listing of an image folder (a million files)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Union

from .errors import DataError

FORMATS = ("colmap", "blender", "transforms")  # --data_format's choices besides auto
MODEL_FILES = (("cameras.bin", "cameras.txt"), ("images.bin", "images.txt"))
FILES = {"blender": "transforms_train.json", "transforms": "transforms.json"}


@dataclass(frozen=True)
class Description:
    """One scene description found in a folder: its format and where it is."""

    format: str  # one of FORMATS
    path: Path  # the COLMAP model folder, or the JSON file

    def label(self, root: Path) -> str:
        where = os.path.relpath(self.path, root)
        return f"COLMAP model {where}/" if self.format == "colmap" else where


def is_model(folder: Path) -> bool:
    """Whether `folder` holds a COLMAP model (cameras and images, binary or text)."""
    return all(any((folder / f).is_file() for f in names) for names in MODEL_FILES)


def _colmap_models(root: Path) -> List[Path]:
    """The COLMAP models of `root`: gsplat's sparse/0 or sparse/ first, then the others one level
    down (sorted), each folder's first of itself, 0/, sparse/0/, sparse/."""
    found = [f for f in (root / "sparse" / "0", root / "sparse") if is_model(f)][:1]
    try:
        subdirs = sorted(e.name for e in os.scandir(root) if e.is_dir() and e.name != "sparse"
                         and not e.name.startswith(("images", ".")))  # image folders hold no model
    except OSError as e:
        raise DataError(f"--data_dir {root}: cannot list the folder ({e.strerror})") from None
    for name in subdirs:
        d = root / name
        match = next((f for f in (d, d / "0", d / "sparse" / "0", d / "sparse") if is_model(f)), None)
        if match is not None:
            found.append(match)
    return found


def discover(root: Union[str, Path]) -> List[Description]:
    """Every scene description in `root`, the preferred first (module docstring)."""
    root = Path(root)
    out = [Description("colmap", m) for m in _colmap_models(root)]
    out += [Description(fmt, root / name) for fmt, name in FILES.items() if (root / name).is_file()]
    return out


def choose(root: Union[str, Path], data_format: str = "auto", colmap_dir: Optional[Union[str, Path]] = None
           ) -> "tuple[Description, List[Description]]":
    """(the description to read, the others found): by --colmap_dir (a model folder, relative
    to `root` when relative), else --data_format, else the first that discover() finds.
    DataError naming the flag and what the folder holds when the choice is not there."""
    root = Path(root)
    found = discover(root)
    if colmap_dir is not None:
        model = Path(colmap_dir) if Path(colmap_dir).is_absolute() else root / colmap_dir
        if not is_model(model):
            raise DataError(f"--colmap_dir {colmap_dir}: {model} holds no COLMAP model (cameras.bin|txt and "
                            f"images.bin|txt){_holds(root, found)}; pass the folder holding the model (relative "
                            "to --data_dir, or absolute)")
        chosen = Description("colmap", model)
        return chosen, [d for d in found if d.path.resolve() != model.resolve()]
    if data_format != "auto":
        if data_format not in FORMATS:
            raise DataError(f"--data_format {data_format}: expected auto or one of {', '.join(FORMATS)}")
        of_format = [d for d in found if d.format == data_format]
        if not of_format:
            want = ("a COLMAP model (sparse/0/ or a folder one level down with cameras and images .bin|txt)"
                    if data_format == "colmap" else FILES[data_format])
            raise DataError(f"--data_format {data_format}: --data_dir {root} has no {want}{_holds(root, found)}; "
                            "pass --data_format auto, or the format of one it holds")
        found = of_format + [d for d in found if d.format != data_format]
    if not found and (root / "sparse").is_dir():  # a damaged model: colmap.find_model and the reader say what is wrong
        return Description("colmap", root / "sparse"), []
    if not found:
        raise DataError(
            f"--data_dir {root} is not a scene: expected a COLMAP capture (images/ and sparse/0/, or a model one "
            "folder down such as colmap_sparse/0/), a Blender/NeRF-synthetic folder (transforms_train.json) or a "
            "nerfstudio or instant-ngp capture (transforms.json); omit --data_dir to train on the built-in "
            "synthetic scene")
    return found[0], found[1:]


def _holds(root: Path, found: Sequence[Description]) -> str:
    if not found:
        return "; the folder holds no scene description"
    return f"; the folder holds {', '.join(d.label(root) for d in found)}"


def describe_choice(root: Union[str, Path], chosen: Description, others: Sequence[Description],
                    data_format: str, colmap_dir: Optional[str]) -> Optional[str]:
    """The line that says which description was read when there was a choice, or one outside
    gsplat's places; None when the folder is an ordinary single-description scene."""
    root = Path(root)
    standard = chosen.format != "colmap" or chosen.path in (root / "sparse" / "0", root / "sparse")
    if not others and standard:
        return None
    if colmap_dir is not None:
        how = "--colmap_dir"
    elif data_format != "auto":
        how = f"--data_format {data_format}"
    elif others and chosen.format == "colmap":
        how = "a COLMAP model comes first: it has the SfM points"
    elif others:
        how = "the first found"
    else:
        how = "found one folder down; gsplat looks only in sparse/0/"
    line = f"--data_dir {root}: reading the {chosen.label(root)} ({how})"
    if others:
        hint = []
        for d in others:
            flag = (f"--colmap_dir {os.path.relpath(d.path, root)}" if d.format == "colmap"
                    else f"--data_format {d.format}")
            hint.append(f"{d.label(root)} ({flag} reads it)")
        line += f"; the folder also holds {', '.join(hint)}"
    return line
