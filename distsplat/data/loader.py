"""Parallel decode + prefetch of a rank's own images, the last stage of the data flow:
given, for each step, the cameras this rank owns in the step's batch (from the
distributed batcher), it keeps `prefetch` steps in flight: decode threads write each image
straight into its place in a preallocated (pinned, with CUDA) batch buffer, and the thread
that finishes a batch's last image issues its host->device copy on a side CUDA stream
and records an event; the consumer's stream waits on that event. So step t+1's images
arrive while step t computes. On CPU the path is the same minus stream and event.

The consumer's thread does as little as it can per step (issue 35: every microsecond of
it is host time a GPU step may wait for; benchmarks/studies/loader/bench_loader_host.py measures it): it
asks the schedule, checks ownership against a byte per scene camera, queues ONE task per
batch, and takes the finished batch. The first worker lays the batch out in its buffer
(specs, offsets, the slot's previous copy), hands the batch's other images to the pool,
and reads one itself; the one that finishes the batch also builds its stacked view. A batch
whose images are all in the decoded cache (steady state) is only copies: its first worker
does them all, so one thread, not one per image, takes Python's lock from the consumer.

A step in which the rank owns no camera does no I/O. Batch buffers are reused: a Batch's
tensors are valid until the next `next()` (copy them to keep them).

Threads, not processes: Pillow releases the GIL while decoding, so threads decode in
parallel and share the cache and the pinned buffers for free. Measured on 2 cores, 1280x720
JPEGs (benchmarks/results/loader_cpu2_2026-11-23.json, `workers`): 2 threads 237 img/s vs 2 forked
processes writing into shared memory 229 img/s (best of 5; medians 128 vs 118).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
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
    _stacked: Optional[Tensor] = None  # [c, H, W, 3] that view, built by the worker that finished the batch

    def stacked(self) -> Tensor:
        """[c, H, W, 3] uint8; a view (no copy) when the images are contiguous in one buffer."""
        if self._stacked is not None:
            return self._stacked
        if not self.images:
            return torch.empty((0, 0, 0, 3), dtype=torch.uint8)
        shapes = {tuple(im.shape) for im in self.images}
        if len(shapes) != 1:
            raise ValueError(f"step {self.step}: images of different sizes {sorted(shapes)} cannot be stacked")
        if self._flat is not None:
            return self._flat[: len(self.images) * self.images[0].numel()].view(len(self.images), *self.images[0].shape)
        return torch.stack(self.images)


class _Pending:
    """One step in flight (slots: built on the consumer's thread every step)."""

    __slots__ = ("step", "cams", "slot", "remaining", "lock", "done", "error", "images", "flat", "stacked",
                 "claimed", "event", "dev")

    def __init__(self, step: int, cams: List[int], slot: int):
        self.step, self.cams, self.slot = step, cams, slot
        self.remaining = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error: Optional[BaseException] = None
        self.images: List[Optional[Tensor]] = [None] * len(cams)
        self.flat: Optional[Tensor] = None
        self.stacked: Optional[Tensor] = None  # [c, H, W, 3] view of flat, when the images have one size
        self.claimed: List[int] = []  # gpu mode: cameras this batch brings to the device
        self.event: Optional[object] = None  # torch.cuda.Event after the host->device copy
        self.dev: Optional[Tensor] = None  # the side stream's device allocation the images are views of


def _work_loop(tasks: "queue.SimpleQueue", stop: List[bool]) -> None:
    while True:
        task = tasks.get()
        if task is None:
            return
        if stop[0]:  # closed: queued tasks are dropped
            continue
        fn, args = task
        try:
            fn(*args)
        except BaseException:  # the tasks report their own errors to next(); this is a bug's last word
            log.exception("image loader task failed")
        del task, fn, args  # an idle thread must not keep the loader alive (its finalizer ends the threads)


def _stop(tasks: "queue.SimpleQueue", stop: List[bool], n: int) -> None:
    stop[0] = True
    for _ in range(n):
        tasks.put(None)


class _Workers:
    """Decode threads fed by one SimpleQueue: a task costs the consumer's thread one put
    (ThreadPoolExecutor.submit also builds a Future and takes three locks, ~20 us of host
    time per call on a 2-core CPU, benchmarks/studies/loader/bench_loader_host.py)."""

    def __init__(self, n: int, name: str):
        self._tasks: "queue.SimpleQueue" = queue.SimpleQueue()
        self._stop = [False]
        self._threads = [threading.Thread(target=_work_loop, args=(self._tasks, self._stop), name=f"{name}_{i}",
                                          daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()
        # An ImageLoader dropped without close() still ends its threads (as a ThreadPoolExecutor's).
        self._finalizer = weakref.finalize(self, _stop, self._tasks, self._stop, n)

    def submit(self, fn: Callable, *args) -> None:
        self._tasks.put((fn, args))

    def shutdown(self) -> None:
        """Drops the queued tasks and waits for the running ones."""
        self._finalizer()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()


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
        self._gpu_cache = cache.mode == "gpu"
        # [C_all] 1 where this rank owns the camera: the per-step ownership check is a byte
        # lookup (1 byte per scene camera), the cache's own search only names the offender.
        self._owned = bytearray(len(cache.specs))
        np.frombuffer(self._owned, dtype=np.uint8)[cache.own] = 1
        self._host: List[Optional[Tensor]] = [None] * (prefetch + 1)  # per slot: flat uint8 batch buffer
        self._slot_event: List[Optional[object]] = [None] * (prefetch + 1)
        self._pool = _Workers(num_workers, "decode")
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
        owned = self._owned
        for c in cams:
            if c < 0 or c >= len(owned) or not owned[c]:
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
        """On the consumer's thread: the schedule, ownership, gpu-mode claims, one task."""
        p = _Pending(step, self._cams(step), (step % (self.prefetch + 1)))
        if self._gpu_cache:
            for j, c in enumerate(p.cams):
                p.images[j] = self.cache.device_view(c)
                if p.images[j] is None and c in self._inflight:
                    p.images[j] = _LATER  # an earlier batch in flight brings it to the device
            todo = [j for j, im in enumerate(p.images) if im is None]
            p.claimed = [p.cams[j] for j in todo]
            for c in p.claimed:
                self._inflight[c] = self._inflight.get(c, 0) + 1
        else:
            todo = list(range(len(p.cams)))
        self._pending.append(p)
        if not todo:  # nothing to read: a step without own cameras, or all on the device already
            p.done.set()
            return
        p.remaining = len(todo)
        self._pool.submit(self._start, p, todo)

    def _start(self, p: _Pending, todo: List[int]) -> None:
        """On a worker: lays batch `p` out in its slot's buffer, queues its other images and
        reads the first."""
        try:
            specs = [self.cache.specs[p.cams[j]] for j in todo]
            offsets = np.concatenate([[0], np.cumsum([s.nbytes for s in specs])])
            if self._slot_event[p.slot] is not None:
                self._slot_event[p.slot].synchronize()  # the slot's previous host->device copy is done
            host = self._buffer(p.slot, int(offsets[-1]))
            p.flat = host if len(todo) == len(p.cams) else None
            arr = host.numpy()
            jobs = [(j, arr[a:b].reshape(spec.shape), (int(a), int(b)))
                    for j, spec, a, b in zip(todo, specs, offsets[:-1], offsets[1:])]
            copies_only = self._copies_only(p, todo)
        except BaseException as e:  # surfaced by next() on the consumer's thread
            p.error = e
            p.done.set()
            return
        if copies_only:  # cached decoded images: copies, one thread for the batch
            for job in jobs:
                self._work(p, *job)
            return
        for job in jobs[1:]:
            self._pool.submit(self._work, p, *job)
        self._work(p, *jobs[0])

    def _copies_only(self, p: _Pending, todo: List[int]) -> bool:
        """Whether every image of the batch is a copy out of the decoded cache (steady state):
        each thread woken for one would only take Python's lock from the consumer for a copy
        of microseconds, so the first worker does them all; decoding is spread over the pool."""
        cache = self.cache
        return cache.mode == "decoded" and all(cache.cached(p.cams[j]) for j in todo)

    def _work(self, p: _Pending, j: int, out: np.ndarray, span) -> None:
        try:
            self.cache.read_into(p.cams[j], out)
            p.images[j] = span  # placeholder: the byte range, turned into a tensor in _finish
        except BaseException as e:  # surfaced by next() on the consumer's thread
            p.error = p.error or e
        self._one_done(p)

    def _one_done(self, p: _Pending) -> None:
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
                        dev = p.dev = host[:total].to(self.device, non_blocking=True)
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
            shape = p.images[0].shape
            if all(im.shape == shape for im in p.images):  # one size: the stacked view, built here once
                p.stacked = flat[: len(p.images) * p.images[0].numel()].view(len(p.images), *shape)

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
        if self._gpu_cache:
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
            # The side stream's allocation is in use on the consumer's stream: the images
            # are views of it, and one record covers the storage they share.
            p.dev.record_stream(stream)
        self.next_step += 1
        ahead = p.step + self.prefetch
        if ahead < self.end_step:
            try:
                self._submit(ahead)
            except BaseException:
                self.close()
                raise
        return Batch(p.step, p.cams, p.images, wait, p.flat, p.stacked)

    def close(self) -> None:
        """Stops the workers (waiting for running decodes); idempotent."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown()
            self._pending.clear()

    def __enter__(self) -> "ImageLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
