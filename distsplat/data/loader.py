"""Parallel decode + prefetch of a rank's own images, the last stage of the data flow:
given, for each step, the cameras this rank owns in the step's batch (from the
distributed batcher), it keeps `prefetch` steps in flight: decode threads write each image
straight into its place in a preallocated (pinned, with CUDA) batch buffer, and the thread
that finishes a batch's last image issues its host->device copy on a side CUDA stream
and records an event; the consumer's stream waits on that event. So step t+1's images
arrive while step t computes. On CPU the path is the same minus stream and event.

A step in which the rank owns no camera does no I/O. Batch buffers are reused: a Batch's
tensors are valid until the next `next()` (copy them to keep them).

Threads, not processes: Pillow releases the GIL while decoding, so threads decode in
parallel and share the cache and the pinned buffers for free. Measured on 2 cores, 1280x720
JPEGs (benchmarks/results/loader_cpu.json, `workers`): 2 threads 237 img/s vs 2 forked
processes writing into shared memory 229 img/s (best of 5; medians 128 vs 118).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from .cache import ImageCache

log = logging.getLogger(__name__)

_LATER = "later"  # placeholder image: taken from the gpu cache when the batch is consumed
Schedule = Union[Callable[[int], Sequence[int]], Sequence[Sequence[int]]]


@dataclass
class Batch:
    step: int
    cameras: List[int]  # [c] this rank's cameras in the step's batch, in batch order
    images: List[Tensor]  # c x [H, W, 3] uint8 on the device
    wait_s: float = 0.0  # how long next() blocked for this batch
    _flat: Optional[Tensor] = None  # the contiguous buffer the images are views of, if they are

    def stacked(self) -> Tensor:
        """[c, H, W, 3] uint8; a view (no copy) when the images are contiguous in one buffer."""
        if not self.images:
            return torch.empty((0, 0, 0, 3), dtype=torch.uint8)
        shapes = {tuple(im.shape) for im in self.images}
        if len(shapes) != 1:
            raise ValueError(f"step {self.step}: images of different sizes {sorted(shapes)} cannot be stacked")
        if self._flat is not None:
            return self._flat[: len(self.images) * self.images[0].numel()].view(len(self.images), *self.images[0].shape)
        return torch.stack(self.images)


@dataclass
class _Pending:
    step: int
    cams: List[int]
    slot: int
    remaining: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)
    error: Optional[BaseException] = None
    images: List[Optional[Tensor]] = field(default_factory=list)
    flat: Optional[Tensor] = None
    claimed: List[int] = field(default_factory=list)  # gpu mode: cameras this batch brings to the device
    event: Optional[object] = None  # torch.cuda.Event after the host->device copy


class ImageLoader:
    """Iterates `Batch`es of steps start_step .. end_step-1; `schedule(step)` (or
    `schedule[step]`) gives this rank's own cameras of that step."""

    def __init__(
        self,
        cache: ImageCache,
        schedule: Schedule,
        start_step: int = 0,
        end_step: Optional[int] = None,
        num_workers: int = 4,
        prefetch: int = 2,
        device: Union[str, torch.device, None] = None,
        pin_memory: Optional[bool] = None,
    ):
        if end_step is None:
            if callable(schedule):
                raise ValueError("end_step is needed when schedule is a function")
            end_step = len(schedule)
        if prefetch < 1 or num_workers < 1:
            raise ValueError(f"prefetch ({prefetch}) and num_workers ({num_workers}) must be >= 1")
        self.cache, self.schedule = cache, schedule
        self.next_step, self.end_step, self.prefetch = start_step, end_step, prefetch
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if cache.mode == "gpu" and cache.device != self.device:
            raise ValueError(f"the gpu-mode cache holds its images on {cache.device}, the loader delivers to {self.device}")
        self.cuda = self.device.type == "cuda"
        self.pin = self.cuda if pin_memory is None else pin_memory
        self._stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._host: List[Optional[Tensor]] = [None] * (prefetch + 1)  # per slot: flat uint8 batch buffer
        self._slot_event: List[Optional[object]] = [None] * (prefetch + 1)
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="decode")
        self._pending: Deque[_Pending] = deque()
        self._inflight: Dict[int, int] = {}  # gpu mode: cameras being read by a pending batch
        self.wait_s: List[float] = []  # per batch, for the benchmark and logs
        self._closed = False
        try:
            for step in range(start_step, min(start_step + prefetch, end_step)):
                self._submit(step)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ producer side
    def _cams(self, step: int) -> List[int]:
        cams = [int(c) for c in (self.schedule(step) if callable(self.schedule) else self.schedule[step])]
        for c in cams:
            self.cache.slot(c)  # OwnershipError now, on the consumer's thread, not in a worker
        return cams

    def _buffer(self, slot: int, nbytes: int) -> Tensor:
        buf = self._host[slot]
        if buf is None or buf.numel() < nbytes:
            if self._slot_event[slot] is not None:
                self._slot_event[slot].synchronize()
            buf = self._host[slot] = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
        return buf

    def _submit(self, step: int) -> None:
        p = _Pending(step, self._cams(step), (step % (self.prefetch + 1)))
        p.images = [None] * len(p.cams)
        if self.cache.mode == "gpu":
            for j, c in enumerate(p.cams):
                p.images[j] = self.cache.device_view(c)
                if p.images[j] is None and c in self._inflight:
                    p.images[j] = _LATER  # an earlier batch in flight brings it to the device
        todo = [j for j, im in enumerate(p.images) if im is None]
        p.claimed = [p.cams[j] for j in todo] if self.cache.mode == "gpu" else []
        for c in p.claimed:
            self._inflight[c] = self._inflight.get(c, 0) + 1
        self._pending.append(p)
        if not todo:  # nothing to read: a step without own cameras, or all on the device already
            p.done.set()
            return
        specs = [self.cache.specs[p.cams[j]] for j in todo]
        offsets = np.concatenate([[0], np.cumsum([s.nbytes for s in specs])])
        if self._slot_event[p.slot] is not None:
            self._slot_event[p.slot].synchronize()  # the slot's previous host->device copy is done
        host = self._buffer(p.slot, int(offsets[-1]))
        p.flat = host if len(todo) == len(p.cams) else None
        arr = host.numpy()
        p.remaining = len(todo)
        for j, spec, a, b in zip(todo, specs, offsets[:-1], offsets[1:]):
            self._pool.submit(self._work, p, j, arr[a:b].reshape(spec.shape), (int(a), int(b)))

    def _work(self, p: _Pending, j: int, out: np.ndarray, span) -> None:
        try:
            self.cache.read_into(p.cams[j], out)
            p.images[j] = span  # placeholder: the byte range, turned into a tensor in _finish
        except BaseException as e:  # surfaced by next() on the consumer's thread
            p.error = p.error or e
        with p.lock:
            p.remaining -= 1
            last = p.remaining == 0
        if last:
            self._finish(p)

    def _finish(self, p: _Pending) -> None:
        """Runs on the thread that decoded the batch's last image."""
        try:
            if p.error is None:
                host = self._host[p.slot]
                spans = [(j, im) for j, im in enumerate(p.images) if isinstance(im, tuple)]
                total = max(b for _, (a, b) in spans)
                if self.cuda:
                    with torch.cuda.stream(self._stream):
                        dev = host[:total].to(self.device, non_blocking=True)
                        self._place(p, spans, dev)
                        p.event = torch.cuda.Event()
                        p.event.record(self._stream)
                    self._slot_event[p.slot] = p.event
                else:
                    self._place(p, spans, host[:total] if self.device.type == "cpu" else host[:total].to(self.device))
        except BaseException as e:
            p.error = e
        finally:
            p.done.set()

    def _place(self, p: _Pending, spans, flat: Tensor) -> None:
        for j, (a, b) in spans:
            img = flat[a:b].view(self.cache.specs[p.cams[j]].shape)  # [H, W, 3]
            self.cache.put_device(p.cams[j], img)  # gpu mode keeps its copy (same stream: after the transfer)
            p.images[j] = img
        if p.flat is not None:
            p.flat = flat

    # ------------------------------------------------------------ consumer side
    def __iter__(self) -> "ImageLoader":
        return self

    def __next__(self) -> Batch:
        if self._closed or self.next_step >= self.end_step:
            raise StopIteration
        p = self._pending.popleft()
        t0 = time.perf_counter()
        p.done.wait()
        wait = time.perf_counter() - t0
        self.wait_s.append(wait)
        if p.error is not None:
            self.close()
            raise p.error
        for j, c in enumerate(p.cams):
            if p.images[j] is _LATER:
                p.images[j] = self.cache.device_view(c)  # filled by an earlier batch, already consumed
        for c in p.claimed:
            self._inflight[c] -= 1
            if not self._inflight[c]:
                del self._inflight[c]
        if p.event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(p.event)
            for im in p.images:  # the side stream's allocation is in use on the consumer's stream
                im.record_stream(stream)
        self.next_step += 1
        ahead = p.step + self.prefetch
        if ahead < self.end_step:
            try:
                self._submit(ahead)
            except BaseException:
                self.close()
                raise
        return Batch(p.step, p.cams, p.images, wait, p.flat)

    def close(self) -> None:
        """Stops the workers (waiting for running decodes); idempotent."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pending.clear()

    def __enter__(self) -> "ImageLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
