"""Returning freed heap memory to the OS after the large setup steps of a big capture.

glibc raises its mmap threshold to the size of the largest array freed (up to 32 MB), so
after a million-camera parse frees its 128 MB temporaries, every [C] array of 4-32 MB
lands on the heap; freed, those pages stay resident (50-130 MB per rank at a million
cameras, issue 20). `trim_heap()` hands them back (malloc_trim); a no-op off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util

TRIM_FROM = 10_000  # cameras: below this the temporaries are small and trimming is not worth a call
_libc = None


def trim_heap() -> None:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
