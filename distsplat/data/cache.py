"""Per-rank image cache: holds the images of the cameras this rank owns, and nothing
else (DESIGN.md invariant 3). The decode workers of the loader (loader.py) read through it.

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

The budget defaults to `fraction` x MemAvailable (from /proc/meminfo) / LOCAL_WORLD_SIZE.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .decode import ImageSpec, decode_into
from .errors import OwnershipError
from .sources import ImageSource

log = logging.getLogger(__name__)

CACHE_MODES = ("none", "compressed", "decoded", "gpu", "auto")
MiB = 1024 * 1024


def mem_available() -> int:
    """Bytes of memory available to new allocations (Linux MemAvailable), else free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def local_world_size() -> int:
    """Ranks sharing this machine's RAM (torchrun sets LOCAL_WORLD_SIZE)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def ram_budget(fraction: float = 0.5, local_ranks: Optional[int] = None) -> int:
    """This rank's share of `fraction` of the available memory."""
    return int(fraction * mem_available() / (local_ranks or local_world_size()))


def choose_mode(compressed_bytes: int, decoded_bytes: int, budget: int) -> Tuple[str, str]:
    """(mode, why) for `auto`."""
    nums = f"decoded share {decoded_bytes / MiB:.1f} MiB, compressed share {compressed_bytes / MiB:.1f} MiB, budget {budget / MiB:.1f} MiB"
    if decoded_bytes <= budget:
        return "decoded", f"the decoded share fits ({nums})"
    if compressed_bytes <= budget:
        return "compressed", f"only the compressed share fits ({nums})"
    return "none", (f"even the compressed share does not fit ({nums}); every image is read and decoded on every use. "
                    f"Use more ranks, a smaller --data_factor, or raise the budget")


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
    ):
        if mode not in CACHE_MODES:
            raise ValueError(f"cache mode must be one of {CACHE_MODES}, got {mode!r}")
        if len(specs) != len(source):
            raise ValueError(f"{len(specs)} specs for {len(source)} images")
        self.source, self.specs = source, list(specs)
        self.own = sorted(set(int(c) for c in own_cameras))
        bad = [c for c in self.own if not 0 <= c < len(specs)]
        if bad:
            raise ValueError(f"own_cameras {bad[:5]} are not camera indices (0..{len(specs) - 1})")
        self._slot: Dict[int, int] = {c: k for k, c in enumerate(self.own)}
        nbytes = np.array([self.specs[c].nbytes for c in self.own], dtype=np.int64)  # [C_own]
        self._offsets = np.concatenate([[0], np.cumsum(nbytes)])  # [C_own + 1]
        self.decoded_bytes = int(self._offsets[-1])
        self.compressed_bytes = int(sum(source.encoded_size(c) for c in self.own))
        self.mode = mode
        if mode == "auto":
            budget = ram_budget() if budget is None else budget
            self.mode, why = choose_mode(self.compressed_bytes, self.decoded_bytes, budget)
            (log.warning if self.mode == "none" else log.info)("image cache for %d own cameras: %s, because %s",
                                                               len(self.own), self.mode, why)
        self._filled = np.zeros(len(self.own), dtype=bool)  # [C_own]
        self._locks = [threading.Lock() for _ in self.own]
        self._blobs: Dict[int, bytes] = {}
        self._buffer: Optional[np.ndarray] = None
        self._device_buffer = None
        self.device = None  # where the gpu mode keeps its images
        if self.mode == "decoded" and self.decoded_bytes:
            # Anonymous shared mapping: pages are committed as images land (RSS grows with
            # what is cached) and forked workers see the same pages.
            self._mmap = mmap.mmap(-1, self.decoded_bytes)
            self._buffer = np.frombuffer(self._mmap, dtype=np.uint8)  # [sum H*W*3]
        if self.mode == "gpu":
            import torch

            self._device_buffer = torch.empty(self.decoded_bytes, dtype=torch.uint8, device=device)
            self.device = self._device_buffer.device

    # ------------------------------------------------------------ lookups
    def slot(self, cam: int) -> int:
        try:
            return self._slot[cam]
        except KeyError:
            raise OwnershipError(f"camera {cam} ({self.source.names[cam] if 0 <= cam < len(self.source) else '?'}) "
                                 f"is not owned by this rank; its cache holds only its {len(self.own)} own cameras") from None

    def owns(self, cam: int) -> bool:
        return cam in self._slot

    def cached(self, cam: int) -> bool:
        return bool(self._filled[self.slot(cam)])

    def cached_names(self) -> List[str]:
        return [self.source.names[c] for k, c in enumerate(self.own) if self._filled[k]]

    def nbytes(self) -> int:
        """Bytes of images held (filled entries only)."""
        if self.mode == "compressed":
            return sum(len(b) for b in self._blobs.values())
        if self.mode in ("decoded", "gpu"):
            return int(sum(self.specs[c].nbytes for k, c in enumerate(self.own) if self._filled[k]))
        return 0

    def _view(self, buf, cam: int):
        k = self._slot[cam]
        return buf[self._offsets[k]:self._offsets[k + 1]].reshape(self.specs[cam].shape)  # [H, W, 3]

    # ------------------------------------------------------------ host path
    def read_into(self, cam: int, out: np.ndarray) -> None:
        """Writes camera `cam`'s [H, W, 3] uint8 image into `out` (a pinned batch slot)."""
        k = self.slot(cam)
        spec, where = self.specs[cam], self.source.where(cam)
        if self.mode in ("none", "gpu"):  # gpu: the device copy is kept by put_device
            decode_into(self.source.read(cam), spec, out, where)
        elif self.mode == "compressed":
            with self._locks[k]:
                blob = self._blobs.get(cam)
                if blob is None:
                    blob = self._blobs[cam] = self.source.read(cam)
                    self._filled[k] = True
            decode_into(blob, spec, out, where)
        else:  # decoded
            view = self._view(self._buffer, cam)
            with self._locks[k]:
                if not self._filled[k]:
                    decode_into(self.source.read(cam), spec, view, where)
                    self._filled[k] = True
            out[...] = view  # written once, read-only afterwards: no lock needed

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
        self._buffer = None
        if getattr(self, "_mmap", None) is not None:
            try:
                self._mmap.close()
            except BufferError:  # a view is still alive somewhere; the GC will unmap it
                pass
        self._device_buffer = None
