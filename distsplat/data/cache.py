"""Per-rank image cache: holds the images of the cameras this rank owns, and nothing
else (docs/design.md invariant 3). The decode workers of the loader (loader.py) read through it.

Modes:
- `none`: read + decode on every use;
- `compressed`: encoded bytes in RAM (filled on first use);
- `decoded`: uint8 pixels in ONE preallocated buffer (a shared anonymous mapping, so
  decode threads, or forked decode processes, write into the same pages: no per-worker
  copies), filled on first use;
- `gpu`: uint8 pixels in one device tensor, filled from the first host->device copy;
- `auto`: `decoded` if the rank's decoded share fits the RAM budget, else `compressed` if
  its encoded share fits, else `none` (logged with the numbers). `auto` never picks `gpu`:
  device memory belongs to the Gaussians unless the user says otherwise.

An explicit `gpu`, `decoded` or `compressed` is checked against its memory before anything
is allocated: a share that does not fit falls back to the largest mode that does (gpu ->
decoded -> compressed -> none), with a warning naming the numbers, instead of an
out-of-memory error mid-training.

The RAM budget defaults to `fraction` x the available memory / LOCAL_WORLD_SIZE, where the
available memory is MemAvailable (from /proc/meminfo) capped by the headroom of the
process's cgroup (containers report the host's MemAvailable); `auto` keeps to half of it,
an explicit mode may use 90%. The device budget of `gpu` is 90% of the free CUDA memory.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Sequence as SequenceABC
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .decode import ImageSpec, decode_into
from .errors import OwnershipError
from .sources import ImageSource

log = logging.getLogger(__name__)

CACHE_MODES = ("none", "compressed", "decoded", "gpu", "auto")
MiB = 1024 * 1024
AUTO_FRACTION = 0.5  # auto leaves the other half to the Gaussians, decoders and the OS
EXPLICIT_FRACTION = 0.9  # an explicit mode is refused only when it would not fit at all
# What a mode holds ("decoded": uint8 pixels, "compressed": encoded bytes) and, when that
# does not fit, what to try next: the largest mode that fits wins.
_LADDER = {"gpu": ("gpu", "decoded", "compressed", "none"), "decoded": ("decoded", "compressed", "none"),
           "compressed": ("compressed", "none"), "none": ("none",)}
_HOLDS = {"gpu": "decoded", "decoded": "decoded", "compressed": "compressed", "none": None}
_NO_LIMIT = 1 << 60  # cgroup v1 reports "no limit" as a huge page-aligned number


def _meminfo(key: str) -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _read_int(path: Path) -> Optional[int]:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        return int(text.split()[0])
    except ValueError:
        return None


def _stat_value(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cgroup_memory(root: Union[str, Path] = "/sys/fs/cgroup",
                  proc_cgroup: Union[str, Path] = "/proc/self/cgroup") -> Optional[Tuple[int, int]]:
    """(limit, usage) in bytes of the tightest memory limit over this process's cgroup and
    its ancestors (v2 memory.max / memory.current, or v1 memory.limit_in_bytes /
    memory.usage_in_bytes), usage net of reclaimable inactive file pages; None: no limit."""
    root = Path(root)
    paths = {"v2": "/", "v1": "/"}
    try:
        for line in Path(proc_cgroup).read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                paths["v2"] = path or "/"
            elif "memory" in controllers.split(","):
                paths["v1"] = path or "/"
    except (OSError, ValueError):
        pass
    layouts = (("v2", root, "memory.max", "memory.current", "inactive_file"),
               ("v1", root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
    best: Optional[Tuple[int, int]] = None
    for version, base, limit_file, usage_file, inactive in layouts:
        parts = [p for p in paths[version].split("/") if p]
        for depth in range(len(parts), -1, -1):  # this cgroup, then its ancestors
            d = base.joinpath(*parts[:depth])
            limit = _read_int(d / limit_file)
            if limit is None or limit >= _NO_LIMIT:
                continue
            usage = _read_int(d / usage_file) or 0
            usage = max(0, usage - _stat_value(d / "memory.stat", inactive))
            if best is None or limit - usage < best[0] - best[1]:
                best = (limit, usage)
    return best


def mem_available() -> int:
    """Bytes of memory available to new allocations: Linux MemAvailable (else free pages),
    capped by the headroom left under the cgroup's memory limit."""
    avail = _meminfo("MemAvailable")
    if avail is None:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cg = cgroup_memory()
    return avail if cg is None else max(0, min(avail, cg[0] - cg[1]))


def mem_total() -> int:
    """Bytes of RAM this process may use at most: MemTotal capped by the cgroup limit."""
    total = _meminfo("MemTotal")
    if total is None:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cg = cgroup_memory()
    return total if cg is None else min(total, cg[0])


def local_world_size() -> int:
    """Ranks sharing this machine's RAM (torchrun sets LOCAL_WORLD_SIZE)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def ram_budget(fraction: float = AUTO_FRACTION, local_ranks: Optional[int] = None) -> int:
    """This rank's share of `fraction` of the available memory."""
    return int(fraction * mem_available() / (local_ranks or local_world_size()))


def device_budget(device=None, fraction: float = EXPLICIT_FRACTION) -> int:
    """`fraction` of the free memory of `device` (CUDA: torch.cuda.mem_get_info); a CPU
    device's memory is this rank's RAM budget."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(fraction * free)
    return ram_budget(fraction)


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n / 1024:.1f} KiB"


def fit_mode(requested: str, compressed_bytes: int, decoded_bytes: int, budget: int,
             host_budget: Optional[int] = None) -> Tuple[str, str]:
    """(mode, why) for an explicit mode: `requested` if its share fits `budget` (the device
    budget for gpu), else the largest mode down the ladder gpu -> decoded -> compressed ->
    none whose share fits (host modes against `host_budget`, default `budget`). `why` is
    empty when the requested mode fits, else the numbers and what to do."""
    host_budget = budget if host_budget is None else host_budget
    need = {"decoded": decoded_bytes, "compressed": compressed_bytes, None: 0}
    for mode in _LADDER[requested]:
        room = budget if mode == "gpu" else host_budget
        if need[_HOLDS[mode]] <= room:
            break
    if mode == requested:
        return mode, ""
    held = _HOLDS[requested]
    where = "device memory" if requested == "gpu" else "RAM"
    got = f"{_size(need[_HOLDS[mode]])} in RAM" if mode != "none" else "no images held"
    todo = {"gpu": "more ranks, a larger --data_factor, or --cache decoded",
            "decoded": "more ranks, a larger --data_factor, or --cache compressed",
            "compressed": "more ranks or a larger --data_factor"}[requested]
    why = (f"its {held} share ({_size(need[held])}) does not fit its {where} budget "
           f"({_size(budget if requested == 'gpu' else host_budget)}); using {mode} instead ({got}). "
           f"To cache {requested}: use {todo} (--cache_budget_gb overrides the measured budget)")
    return mode, why


def choose_mode(compressed_bytes: int, decoded_bytes: int, budget: int) -> Tuple[str, str]:
    """(mode, why) for `auto`."""
    nums = f"decoded share {decoded_bytes / MiB:.1f} MiB, compressed share {compressed_bytes / MiB:.1f} MiB, budget {budget / MiB:.1f} MiB"
    if decoded_bytes <= budget:
        return "decoded", f"the decoded share fits ({nums})"
    if compressed_bytes <= budget:
        return "compressed", f"only the compressed share fits ({nums})"
    return "none", (f"even the compressed share does not fit ({nums}); every image is read and decoded on every use. "
                    f"Use more ranks, a larger --data_factor, or raise the budget (--cache_budget_gb)")


LOCK_STRIPES = 64  # fill locks of a cache (slots share them round robin)


class ImageCache:
    """Images of `own_cameras` (indices into `specs`/`source`), in `mode`. Asking for any
    other camera raises OwnershipError. Safe for concurrent decode threads."""

    def __init__(
        self,
        source: ImageSource,
        specs: Sequence[ImageSpec],  # [C_all] one per camera of the scene
        own_cameras: Sequence[int],
        mode: str = "auto",
        device=None,
        budget: Optional[int] = None,
        rank: Optional[int] = None,
    ):
        """`budget`: bytes this cache may hold, overriding the measured budgets (RAM, and
        device memory for gpu); `rank` only labels the log lines."""
        if mode not in CACHE_MODES:
            raise ValueError(f"cache mode must be one of {CACHE_MODES}, got {mode!r}")
        if len(specs) != len(source):
            raise ValueError(f"{len(specs)} specs for {len(source)} images")
        # A Sequence is kept as given (Scene.specs() is lazy: no C_all spec objects per rank).
        self.source, self.specs = source, (specs if isinstance(specs, SequenceABC) else list(specs))
        # [C_own] int64 ascending: an array, not a list and a dict of Python ints (~130 bytes
        # per own camera with the per-camera locks: 65 MB per rank at a million images, W = 2)
        self.own = np.unique(np.asarray(own_cameras, dtype=np.int64).reshape(-1))
        bad = self.own[(self.own < 0) | (self.own >= len(specs))]
        if len(bad):
            raise ValueError(f"own_cameras {bad[:5].tolist()} are not camera indices (0..{len(specs) - 1})")
        if hasattr(self.specs, "nbytes_of"):  # Scene.specs(): from the size arrays, no spec per camera
            nbytes = np.asarray(self.specs.nbytes_of(self.own), dtype=np.int64)  # [C_own]
        else:
            nbytes = np.array([self.specs[c].nbytes for c in self.own.tolist()], dtype=np.int64)  # [C_own]
        self._offsets = np.concatenate([[0], np.cumsum(nbytes)])  # [C_own + 1]
        self.decoded_bytes = int(self._offsets[-1])
        enc = np.array([source.encoded_size(c) for c in self.own.tolist()], dtype=np.int64)  # [C_own]
        self._enc_offsets = np.concatenate([[0], np.cumsum(enc)]).astype(np.int64)  # [C_own + 1]
        self.compressed_bytes = int(self._enc_offsets[-1])
        self.mode = mode
        who = f"[rank {rank}] image cache" if rank is not None else "image cache"  # the log filter's prefix
        if mode == "auto":
            budget = ram_budget() if budget is None else budget
            self.mode, why = choose_mode(self.compressed_bytes, self.decoded_bytes, budget)
            (log.warning if self.mode == "none" else log.info)("%s for %d own cameras: %s, because %s",
                                                               who, len(self.own), self.mode, why)
        elif mode != "none":
            # Checked before anything is allocated: an explicit mode that cannot hold the
            # rank's share falls back (and says so) rather than failing mid-training.
            host = ram_budget(EXPLICIT_FRACTION) if budget is None else budget
            dev = (device_budget(device) if budget is None else budget) if mode == "gpu" else host
            self.mode, why = fit_mode(mode, self.compressed_bytes, self.decoded_bytes, dev, host)
            if why:
                log.warning("%s: --cache %s for %d own cameras: %s", who, mode, len(self.own), why)
        self._filled = np.zeros(len(self.own), dtype=bool)  # [C_own]
        # Striped locks: slot k fills under _locks[k % LOCK_STRIPES] (a few decode threads at once)
        self._locks = [threading.Lock() for _ in range(min(LOCK_STRIPES, max(len(self.own), 1)))]
        # compressed mode: the encoded images in one arena at _enc_offsets (no bytes object of
        # ~50 bytes' overhead per image: 25 MB per rank at a million images, W = 2); by slot,
        # what does not fit it (an in-memory source's arrays, a file whose size changed)
        self._blobs: Dict[int, object] = {}
        self._arena: Optional[np.ndarray] = None
        self._buffer: Optional[np.ndarray] = None
        self._device_buffer = None
        self.device = None  # where the gpu mode keeps its images
        if self.mode == "decoded" and self.decoded_bytes:
            # Anonymous shared mapping: pages are committed as images land (RSS grows with
            # what is cached) and forked workers see the same pages.
            self._mmap = mmap.mmap(-1, self.decoded_bytes)
            self._buffer = np.frombuffer(self._mmap, dtype=np.uint8)  # [sum H*W*3]
        if self.mode == "compressed" and self.compressed_bytes:
            self._arena_mmap = mmap.mmap(-1, self.compressed_bytes)  # committed as images land, as decoded
            self._arena = np.frombuffer(self._arena_mmap, dtype=np.uint8)  # [sum encoded sizes]
        if self.mode == "gpu":
            import torch

            self._device_buffer = torch.empty(self.decoded_bytes, dtype=torch.uint8, device=device)
            self.device = self._device_buffer.device

    # ------------------------------------------------------------ lookups
    def _find(self, cam: int) -> int:
        """Slot of `cam`, -1 when not owned (binary search of the sorted own cameras)."""
        k = int(np.searchsorted(self.own, cam))
        return k if k < len(self.own) and self.own[k] == cam else -1

    def slot(self, cam: int) -> int:
        k = self._find(cam)
        if k < 0:
            raise OwnershipError(f"camera {cam} ({self.source.names[cam] if 0 <= cam < len(self.source) else '?'}) "
                                 f"is not owned by this rank; its cache holds only its {len(self.own)} own cameras")
        return k

    def owns(self, cam: int) -> bool:
        return self._find(cam) >= 0

    def cached(self, cam: int) -> bool:
        return bool(self._filled[self.slot(cam)])

    def cached_names(self) -> List[str]:
        return [self.source.names[c] for c in self.own[self._filled].tolist()]

    def nbytes(self) -> int:
        """Bytes of images held (filled entries only)."""
        if self.mode == "compressed":
            in_arena = self._filled.copy()
            in_arena[list(self._blobs)] = False
            extra = sum(b.nbytes if isinstance(b, np.ndarray) else len(b) for b in self._blobs.values())
            return int(np.diff(self._enc_offsets)[in_arena].sum()) + extra
        if self.mode in ("decoded", "gpu"):
            return int(np.diff(self._offsets)[self._filled].sum())
        return 0

    def _view(self, buf, cam: int):
        k = self.slot(cam)
        return buf[self._offsets[k]:self._offsets[k + 1]].reshape(self.specs[cam].shape)  # [H, W, 3]

    # ------------------------------------------------------------ host path
    def read_into(self, cam: int, out: np.ndarray) -> None:
        """Writes camera `cam`'s [H, W, 3] uint8 image into `out` (a pinned batch slot)."""
        k = self.slot(cam)
        spec, where = self.specs[cam], self.source.where(cam)
        if self.mode in ("none", "gpu"):  # gpu: the device copy is kept by put_device
            decode_into(self.source.read(cam), spec, out, where)
        elif self.mode == "compressed":
            with self._locks[k % len(self._locks)]:
                if not self._filled[k]:
                    self._store(k, cam)
            blob = self._blobs.get(k)
            if blob is None:  # in the arena: written once, read-only afterwards
                blob = self._arena.data[self._enc_offsets[k]:self._enc_offsets[k + 1]]
            decode_into(blob, spec, out, where)
        else:  # decoded
            view = self._view(self._buffer, cam)
            with self._locks[k % len(self._locks)]:
                if not self._filled[k]:
                    decode_into(self.source.read(cam), spec, view, where)
                    self._filled[k] = True
            out[...] = view  # written once, read-only afterwards: no lock needed

    def _store(self, k: int, cam: int) -> None:
        """compressed mode: reads camera `cam` (slot k) into the arena (under slot k's lock)."""
        blob = self.source.read(cam)
        a, b = int(self._enc_offsets[k]), int(self._enc_offsets[k + 1])
        if isinstance(blob, (bytes, bytearray)) and len(blob) == b - a and self._arena is not None:
            self._arena[a:b] = np.frombuffer(blob, dtype=np.uint8)
        else:
            self._blobs[k] = blob
        self._filled[k] = True

    # ------------------------------------------------------------ gpu mode
    def device_view(self, cam: int):
        """[H, W, 3] uint8 device tensor of a cached camera (gpu mode), else None."""
        k = self.slot(cam)
        if self.mode != "gpu" or not self._filled[k]:
            return None
        return self._view(self._device_buffer, cam)

    def put_device(self, cam: int, image) -> None:
        """Keeps a copy of `image` [H, W, 3] uint8 (already on the device) in gpu mode. The
        copy is issued on the current stream, after the host->device copy that made `image`."""
        k = self.slot(cam)
        if self.mode == "gpu" and not self._filled[k]:
            self._view(self._device_buffer, cam).copy_(image, non_blocking=True)
            self._filled[k] = True

    def close(self) -> None:
        self._blobs.clear()
        self._buffer = self._arena = None
        for name in ("_mmap", "_arena_mmap"):
            if getattr(self, name, None) is not None:
                try:
                    getattr(self, name).close()
                except BufferError:  # a view is still alive somewhere; the GC will unmap it
                    pass
        self._device_buffer = None
