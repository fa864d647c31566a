"""Compact per-camera tables for captures of a million images (issue 20): image names as
one numpy bytes array instead of a list of str, and per-camera point tracks in CSR form
instead of a list of arrays. Both are read-only Sequences, so code written for lists
(`names[i]`, `len`, iteration, slices) keeps working; a million Python str or ndarray
objects cost ~70-110 bytes each per rank, these cost the bytes themselves.

The bottom of the data layer: sources.py and scene.py import it, it imports only numpy.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Sequence, Union

import numpy as np

# A fixed-width table costs C x the longest name: fall back to a list of str when one name
# would make it far larger than the names themselves (real captures' names have similar lengths).
WIDTH_SLACK = 16


class NameList(Sequence):
    """[C] image names held as UTF-8 bytes in one numpy array (`raw`, dtype 'S<width>');
    `names[i]` decodes one name. Names must not contain NUL (numpy strips trailing NULs;
    COLMAP names are NUL-terminated, so they never do)."""

    def __init__(self, raw: np.ndarray):
        raw = np.asarray(raw)
        if raw.ndim != 1 or raw.dtype.kind != "S":
            raise ValueError(f"NameList needs a [C] bytes array, got {raw.dtype} {raw.shape}")
        self.raw = raw  # [C] bytes
        self._sorted: Optional[bool] = None

    @staticmethod
    def from_bytes(items: Sequence[bytes]) -> Union["NameList", List[str]]:
        """NameList of UTF-8 `items`, or a list of str when a fixed-width table would waste
        more than WIDTH_SLACK x the names' bytes. Raises UnicodeDecodeError for non-UTF-8."""
        total = sum(map(len, items))
        width = max(map(len, items), default=0)
        if width * len(items) > WIDTH_SLACK * total + (1 << 20):
            return [b.decode("utf-8") for b in items]
        b"\n".join(items).decode("utf-8")  # validates all at once (one str, freed at once)
        return NameList(np.array(items, dtype=bytes if width else "S1"))

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [b.decode("utf-8") for b in self.raw[i].tolist()]
        return self.raw[i].decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        for b in self.raw.tolist() if len(self.raw) <= 4096 else self.raw:
            yield b.decode("utf-8")

    def __eq__(self, other) -> bool:
        if isinstance(other, NameList):
            return bool(np.array_equal(self.raw, other.raw))
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        head = ", ".join(repr(n) for n in self[:3])
        return f"NameList([{head}{', ...' if len(self) > 3 else ''}], {len(self)} names)"

    def is_sorted(self) -> bool:
        """Strictly increasing (hence no duplicates); bytes order is code point order in UTF-8."""
        if self._sorted is None:
            self._sorted = bool(len(self.raw) < 2 or (self.raw[1:] > self.raw[:-1]).all())
        return self._sorted

    def has_duplicates(self) -> bool:
        return not self.is_sorted() and len(np.unique(self.raw)) != len(self.raw)

    def positions(self, names: Sequence[str]) -> np.ndarray:
        """[len(names)] int64 index of each name here, -1 where absent (no dict of C entries)."""
        wanted = np.array([n.encode("utf-8") for n in names], dtype=bytes) if len(names) else np.zeros(0, "S1")
        if not len(self.raw):
            return np.full(len(wanted), -1, np.int64)
        order = None if self.is_sorted() else np.argsort(self.raw, kind="stable")
        table = self.raw if order is None else self.raw[order]
        rows = np.minimum(np.searchsorted(table, wanted), len(table) - 1)
        found = table[rows] == wanted
        pos = rows if order is None else order[rows]
        return np.where(found, pos, -1).astype(np.int64)


GATHER_CHUNK = 1 << 16  # names gathered at once (bounded temporaries: ~B x width x 8 bytes of indices)


def fixed_width(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> Optional[np.ndarray]:
    """[C] 'S<width>' array of the byte strings data[starts[i]:starts[i] + lengths[i]]
    (data: [N] uint8), gathered with numpy in chunks: no bytes object per name. None when
    one string is far longer than the rest (the caller keeps objects then)."""
    C = len(starts)
    width = int(lengths.max()) if C else 0
    if width * C > WIDTH_SLACK * int(lengths.sum()) + (1 << 20):
        return None
    out = np.zeros(C, f"S{max(width, 1)}")
    col = np.arange(out.dtype.itemsize)
    last = max(len(data) - 1, 0)
    for a in range(0, C, GATHER_CHUNK):
        b = min(a + GATHER_CHUNK, C)
        inside = col < lengths[a:b, None]  # [B, width]
        chunk = np.where(inside, data[np.minimum(starts[a:b, None] + col, last)], 0).astype(np.uint8)
        out[a:b] = np.ascontiguousarray(chunk).view(out.dtype)[:, 0]
    return out


def utf8_ok(names: np.ndarray) -> bool:
    """Every name of a [C] 'S' array is UTF-8: the table's bytes are, and no name starts with a
    continuation byte (NUL padding is ASCII, so a name cut inside a character fails one test)."""
    if not len(names):
        return True
    first = names.view(np.uint8).reshape(len(names), -1)[:, 0]  # [C]
    try:
        names.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not ((first & 0xC0) == 0x80).any()


def encoded(names: Sequence[str]) -> np.ndarray:
    """[C] UTF-8 bytes array of `names` (a NameList's own array, no copy)."""
    if isinstance(names, NameList):
        return names.raw
    return np.array([n.encode("utf-8") for n in names], dtype=bytes) if len(names) else np.zeros(0, "S1")


class TrackTable(Sequence):
    """[C] per camera, the sorted int64 indices into Scene.points of the SfM points its image
    sees: `indices[offsets[c]:offsets[c + 1]]` (CSR; a list of C arrays costs ~110 bytes
    per camera even when empty)."""

    def __init__(self, offsets: np.ndarray, indices: np.ndarray):
        offsets = np.asarray(offsets, dtype=np.int64)  # [C + 1]
        self.indices = np.asarray(indices, dtype=np.int64)  # [T]
        if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(self.indices):
            raise ValueError("TrackTable: offsets must be [C + 1] from 0 to len(indices)")
        if not len(self.indices):  # no tracks at all (e.g. a model exported without them): no bytes per camera
            self.offsets = np.broadcast_to(np.zeros(1, np.int64), offsets.shape)
        else:
            self.offsets = offsets.astype(np.int32) if len(self.indices) <= np.iinfo(np.int32).max else offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, c):
        if isinstance(c, slice):
            return [self[j] for j in range(*c.indices(len(self)))]
        if not -len(self) <= c < len(self):
            raise IndexError(c)
        c = int(c) % len(self)
        return self.indices[int(self.offsets[c]):int(self.offsets[c + 1])]
