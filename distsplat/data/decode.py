"""Decoding one stored image into a caller-owned [H, W, 3] uint8 buffer: the only place
pixels are produced, used by every cache mode and every decode worker, so all modes give
the same bytes as a plain Pillow decode.

Also the up-front image checks (`check_images`): missing files, headers that do not parse,
truncated JPEGs and PNGs and sizes that match no downscale of their camera are found here while
the scene is loaded, before the trainer's first collective.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image, UnidentifiedImageError

from .errors import DataError, repair_of

log = logging.getLogger(__name__)

# Headers (JPEG SOF, PNG IHDR) are near the start: the first FIRST_HEADER_BYTES hold most
# (no or a small EXIF block); a header not found there is read again up to HEADER_BYTES, which
# also covers big EXIF blocks and ICC profiles. The up-front check reads every image of the
# capture on every rank (own ones with shards or node-local data): 16 KiB instead of 256 KiB
# of each multi-megabyte photo.
FIRST_HEADER_BYTES = 16 * 1024
HEADER_BYTES = 256 * 1024


@dataclass(frozen=True)
class ImageSpec:
    name: str
    width: int  # size the image is loaded at
    height: int
    src_width: int  # size of the stored image; differs when downscaled on the fly
    src_height: int
    background: Optional[Tuple[int, int, int]] = None  # composite RGBA on this RGB
    # undistort.Undistortion of a distorted camera: the image is decoded at its in_size,
    # then remapped to (width, height). Shared by the camera's images, not compared.
    undistort: Any = field(default=None, compare=False, repr=False)

    @property
    def decoded_size(self) -> Tuple[int, int]:
        """(w, h) the stored image is decoded (and resized) to, before any undistortion."""
        return tuple(self.undistort.in_size) if self.undistort is not None else (self.width, self.height)

    @property
    def nbytes(self) -> int:
        return self.width * self.height * 3

    @property
    def shape(self) -> Tuple[int, int, int]:
        return (self.height, self.width, 3)


def decode_image(data: Union[bytes, memoryview, np.ndarray], spec: ImageSpec, where: str) -> Image.Image:
    """Encoded bytes (or an in-memory [h, w, 3] uint8 array) -> RGB PIL image of spec's
    decoded size (its size, unless the camera is undistorted afterwards).

    JPEGs that are downscaled on load use Pillow's draft mode (libjpeg's DCT scaling to the
    smallest power-of-two reduction still >= the target), then a bicubic resize."""
    dw, dh = spec.decoded_size
    if isinstance(data, np.ndarray):
        if data.shape != (dh, dw, 3) or data.dtype != np.uint8:
            raise DataError(f"{where}: in-memory image is {data.shape} {data.dtype}, expected {(dh, dw, 3)} uint8")
        return Image.fromarray(data)
    try:
        im = Image.open(io.BytesIO(data))
        if (im.width, im.height) != (spec.src_width, spec.src_height):
            raise DataError(f"{where}: image is {im.width}x{im.height}, expected {spec.src_width}x{spec.src_height}")
        resize = (dw, dh) != (im.width, im.height)
        if resize and im.format == "JPEG":
            im.draft("RGB", (dw, dh))
        im.load()
    except DataError:
        raise
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError... for bad data
        raise DataError(f"{where}: cannot decode image ({type(e).__name__}: {e}); {repair_of(where)}") from None
    has_alpha = im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info)
    if spec.background is not None and has_alpha:  # without a background, alpha is dropped (gsplat: [..., :3])
        bg = Image.new("RGBA", im.size, (*spec.background, 255))
        im = Image.alpha_composite(bg, im.convert("RGBA"))
    if im.mode != "RGB":
        im = im.convert("RGB")
    if resize and im.size != (dw, dh):
        im = im.resize((dw, dh), Image.BICUBIC)
    return im


def decode_into(data: Union[bytes, memoryview, np.ndarray], spec: ImageSpec, out: np.ndarray, where: str) -> None:
    """Decodes into out [H, W, 3] uint8 (a slot of a cache or of a pinned batch buffer).
    Pillow keeps RGB as 4 bytes a pixel, so one packing copy into `out` is unavoidable.
    A distorted camera's image is undistorted here, on the rank that owns it (undistort.py)."""
    if spec.undistort is not None:
        out[...] = spec.undistort(np.asarray(decode_image(data, spec, where)), where)
        return
    if isinstance(data, np.ndarray):
        if data.shape != spec.shape or data.dtype != np.uint8:
            raise DataError(f"{where}: in-memory image is {data.shape} {data.dtype}, expected {spec.shape} uint8")
        out[...] = data
        return
    out[...] = np.asarray(decode_image(data, spec, where))


# JPEG start-of-frame markers (the frame header holds the size): C0-CF but DHT (C4), JPG (C8), DAC (CC)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_NO_LENGTH = frozenset(range(0xD0, 0xD8)) | {0x01}  # RSTn and TEM: markers without a segment


def fast_size(head: bytes) -> Optional[Tuple[int, int]]:
    """(width, height) of a JPEG (its frame header) or a PNG (IHDR) read directly from the
    first bytes, or None for anything else or anything unusual (Pillow decides then). The
    up-front check reads a million headers at a million images: Pillow's open costs ~40 us
    an image, this ~2 us, and reads the same fields Pillow does."""
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        if len(head) >= 24 and head[12:16] == b"IHDR":
            w, h = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
            return (w, h) if w > 0 and h > 0 else None
        return None
    if head[:2] != b"\xff\xd8":
        return None
    pos, n = 2, len(head)
    while pos + 4 <= n:
        if head[pos] != 0xFF:
            return None  # not at a marker: let Pillow judge
        marker = head[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _NO_LENGTH:
            pos += 2
            continue
        if marker in (0xD9, 0xDA) or marker < 0xC0:  # end of image or scan before a frame header, or
            return None  # no JPEG marker (Pillow: "no marker found")
        length = (head[pos + 2] << 8) | head[pos + 3]
        if marker in _SOF:
            if pos + 10 > n:
                return None
            h, w = (head[pos + 5] << 8) | head[pos + 6], (head[pos + 7] << 8) | head[pos + 8]
            layers = head[pos + 9]
            # the frame Pillow opens: 8-bit samples, 1, 3 or 4 components, the length they make;
            # anything else (a damaged header, a 12-bit JPEG, height 0 for DNL) is Pillow's call
            if head[pos + 4] != 8 or layers not in (1, 3, 4) or length != 8 + 3 * layers or not (w > 0 and h > 0):
                return None
            return w, h
        pos += 2 + length
    return None


def _read_header(head: bytes) -> Tuple[Optional[Tuple[int, int]], str]:
    """((width, height), "") from the first bytes of an encoded image, or (None, why not):
    not an image, or cut before its header ends."""
    size = fast_size(head)
    if size is not None:
        return size, ""
    try:
        with Image.open(io.BytesIO(head)) as im:
            return im.size, ""
    except UnidentifiedImageError:  # its message names the BytesIO, not the file
        return None, f"starts with {head[:8]!r}, the header of no image format Pillow reads"
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"


def header_size(head: bytes, where: str) -> Tuple[int, int]:
    """(width, height) from the first bytes of an encoded image."""
    size, why = _read_header(head)
    if size is None:
        raise DataError(f"{where}: not a readable image ({why}); {repair_of(where)}")
    return size


def is_jpeg(head: bytes) -> bool:
    return head[:3] == b"\xff\xd8\xff"


def is_png(head: bytes) -> bool:
    return head[:8] == b"\x89PNG\r\n\x1a\n"


PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk's type and CRC: the last 8 bytes of every PNG


def check_truncated(head: bytes, tail: bytes, where: str) -> None:
    """A JPEG must end with the EOI marker FFD9, a PNG with its IEND chunk (either
    optionally followed by padding zeros that some writers append); a cut-off download or
    copy does not."""
    if not _ends_whole(head, tail):
        what = "JPEG (no end-of-image marker)" if is_jpeg(head) else "PNG (no IEND chunk at the end)"
        raise DataError(f"{where}: truncated {what}; {repair_of(where)}")


def scale_matches(w: int, h: int, cam_w: int, cam_h: int) -> bool:
    """True when (w, h) is (cam_w, cam_h) scaled by one factor s, up to rounding (1 px)."""
    lo = max((w - 1) / cam_w, (h - 1) / cam_h)
    hi = min((w + 1) / cam_w, (h + 1) / cam_h)
    return lo <= hi and hi > 0


def draft_note(names: Sequence[str]) -> str:
    """The load line's note on how images are downscaled on load: ' (JPEG draft mode)' for
    JPEGs (Pillow decodes them at a reduced size first), nothing for PNGs (decoded whole, then
    resized). Looks at the first name: a capture's images share a format."""
    first = str(names[0]).lower() if len(names) else ""
    return " (JPEG draft mode)" if first.endswith((".jpg", ".jpeg")) else ""


def downscaled_size(w: int, h: int, factor: int) -> Tuple[int, int]:
    """gsplat's `_resize_image_folder` size: round(w / factor), round(h / factor)."""
    return int(round(w / factor)), int(round(h / factor))


def check_sizes(names: Sequence[str], sizes: Sequence[Tuple[int, int]], cam_sizes: Sequence[Tuple[int, int]], where: Sequence[str]) -> None:
    for name, (w, h), (cw, ch), path in zip(names, sizes, cam_sizes, where):
        if not scale_matches(w, h, cw, ch):
            raise DataError(f"{path}: image is {w}x{h} but its camera is {cw}x{ch}; no downscale of the camera gives that size "
                            f"(wrong image, or an images_N/ folder made with a different factor)")


def probe_images(source, indices: Sequence[int]) -> list:
    """Reads the header (and the last bytes) of each image of `source` at `indices`:
    raises DataError for an unreadable header or a truncated JPEG; returns [(w, h)]."""
    sizes = []
    for i in indices:
        head, tail = source.peek(i, FIRST_HEADER_BYTES)
        size = fast_size(head)
        if size is not None and _ends_whole(head, tail):  # the common case: a whole JPEG or PNG
            sizes.append(size)
            continue
        where = source.where(i)
        check_truncated(head, tail, where)  # first: a cut can also break the header
        size, _ = _read_header(head)
        if size is None and len(head) == FIRST_HEADER_BYTES:  # a header past the first bytes (big EXIF)
            head, _ = source.peek(i, HEADER_BYTES)
        sizes.append(size or header_size(head, where))  # a DataError saying why when there is none
    return sizes


def _ends_whole(head: bytes, tail: bytes) -> bool:
    """Whether a JPEG's or PNG's end is there (anything else: nothing to check)."""
    end = tail.rstrip(b"\0")
    return end.endswith(b"\xff\xd9") if is_jpeg(head) else (not is_png(head) or end.endswith(PNG_END))


def check_images(source, specs: Sequence[ImageSpec], indices: Sequence[int]) -> None:
    """Checks that each image of `source` at `indices` is readable, not truncated, and of
    the stored size its spec expects (e.g. after swapping a folder for tar shards)."""
    for i, (w, h) in zip(indices, probe_images(source, indices)):
        s = specs[i]
        if (w, h) != (s.src_width, s.src_height):
            raise DataError(f"{source.where(i)}: image is {w}x{h}, expected {s.src_width}x{s.src_height}")
