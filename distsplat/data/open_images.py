"""Opening a scene's images: the steps the scene parsers (colmap.py, nerfstudio.py,
blender.py) share between reading a description and building its `Scene` (docs/design.md,
start-up step 3), so each parser keeps only what its format makes different.

    open_images       tar shards by their index (--shards), else the parser's folder; images
                      the folder lacks are a DataError, or left out with --skip_missing_images
                      and the folder opened again on the names kept
    stored_sizes      every image's header when checking, else the first present image of each
                      camera size; each against its camera's size (a downscale of it)
    shards_downscaled shards packed from images/ with --data_factor N: downscaled on load, as
                      a folder's images/ is when images_N/ is missing (the parser decides that)

Nothing here is per image in Python beyond what checking reads anyway: a node-local stage
(check=False) of a million images opens, drops nothing and reads one header per camera size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from .decode import check_sizes, probe_images
from .names import NameList
from .shards import TarShardSource
from .sources import FolderSource, ImageSource, Lister, first_present, keep_present


class OpenedImages(NamedTuple):
    source: ImageSource  # of `names`
    names: Sequence[str]  # [C_kept] the names given, less those dropped (the same object when none is)
    keep: Optional[np.ndarray]  # [C_kept] int64 indices of the names kept; None: all kept
    dropped: List[str]  # names left out for an absent image (the split files may list them)


def open_images(
    names: Sequence[str],  # [C]
    shards: Optional[Union[str, Path]],
    folder: Callable[[Sequence[str]], FolderSource],
    model: Lister,
    check: bool,
    skip_missing: bool,
    why: str = "--skip_missing_images",
) -> OpenedImages:
    """The scene's image source: `shards` (an index.json of tar shards holding the images by
    name) when given, else `folder(names)`, the parser's files. With `check`, a file absent
    from the folder is a DataError naming `model` (the file that lists it, or camera index ->
    that file), unless `skip_missing`: then one warning (`why`: what made it skip) and the
    folder is opened again on the names kept; the caller drops the same rows (`keep`) of
    its own per-camera arrays. Without `check` (images staged per node) nothing is dropped:
    a node lacks the other nodes' images."""
    if shards is not None:
        # check=False: other nodes' images may be absent from a node's staged shards
        return OpenedImages(TarShardSource(shards, names=names, check_shards=check, missing_ok=not check), names, None, [])
    source = folder(names)
    keep = keep_present(source, model, skip_missing, why) if check else None
    if keep is None:
        return OpenedImages(source, names, None, [])
    dropped = [names[i] for i in np.setdiff1d(np.arange(len(names)), keep).tolist()]
    kept = NameList(names.raw[keep]) if isinstance(names, NameList) else [names[i] for i in keep.tolist()]
    return OpenedImages(folder(kept), kept, keep, dropped)


def stored_sizes(
    source: ImageSource,
    probed: Optional[Sequence[Tuple[int, int]]],  # [C] (w, h) of every image, or None
    size_of_image: np.ndarray,  # [C] int64 row of `sizes_wh`
    sizes_wh: np.ndarray,  # [S, 2] int64 (w, h) of the cameras
    what: Callable[[int, int], str],
) -> np.ndarray:  # [C, 2] int64
    """(w, h) each image is stored at, each a downscale of its camera's size (check_sizes:
    DataError otherwise). `probed`: every image's header, read by the parser when checking
    (before it knows the cameras' sizes: instant-ngp frames take theirs from the images).
    None: only the first image present of each camera size is read, as gsplat reads one
    image: images staged per node (check=False) are only the node's own, and a camera size's
    images are stored at one size (the owner's check_images verifies its own at setup).
    `what(w, h)`: what the error names when none of a size's images is present here."""
    if probed is not None:
        check_sizes(source.names, probed, sizes_wh[size_of_image].tolist(), (source.where(i) for i in range(len(probed))))
        return np.array(probed, dtype=np.int64).reshape(-1, 2)
    first = np.full((len(sizes_wh), 2), -1, dtype=np.int64)  # [S, 2]
    for g in np.unique(size_of_image).tolist():
        w, h = sizes_wh[g].tolist()
        i = first_present(source, what(w, h), np.flatnonzero(size_of_image == g).tolist())
        first[g] = probe_images(source, [i])[0]
        check_sizes([source.names[i]], [tuple(first[g])], [(w, h)], [source.where(i)])
    return first[size_of_image]


def shards_downscaled(shards: Optional[Union[str, Path]], factor: int, stored: np.ndarray,
                      size_of_image: np.ndarray, sizes_wh: np.ndarray) -> bool:
    """Whether images read from tar shards are downscaled on load: with --data_factor N, when
    every image is stored at its camera's full size (shards of images/, not of images_N/).
    stored [C, 2], size_of_image [C] and sizes_wh [S, 2] as stored_sizes takes and gives them."""
    return shards is not None and factor > 1 and bool((stored == sizes_wh[size_of_image]).all())
