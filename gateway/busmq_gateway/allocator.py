"""The C allocator of a gateway process: its arenas capped, and its bytes in use and
free, for ``/metrics``.

glibc's malloc gives a thread that finds the heap busy an arena of its own (up to eight
per core) and returns little of a thread arena's freed memory to the system. grpc's
C-core threads allocate per call and per connection, so under load each of them grew an
arena whose freed space stayed in the RSS: in 20 rounds of 1,000 streams on new
connections (``tests/gateway/test_soak.py``) with both cores busy, thread arenas held 7
to 10 MB each with 0.1 to 0.4 MB of it in use. Two arenas bound that. ``MALLOC_ARENA_MAX``
in the environment, glibc's own knob, wins over this.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2


def cap_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's arenas; true if the cap was set. Call it before any thread starts:
    glibc fixes the limit the first time a second thread needs an arena."""
    if "MALLOC_ARENA_MAX" in os.environ or not _glibc():
        return False
    return bool(ctypes.CDLL(None).mallopt(M_ARENA_MAX, arenas))


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):
        return False


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


@dataclass(frozen=True)
class MallocBytes:
    in_use: int
    """Allocated and not freed (``malloc`` arenas and its own ``mmap`` blocks)."""
    free: int
    """Freed and kept by the allocator for reuse: no leak, and part of the RSS (not all of
    it: pages the allocator gave back are counted too)."""


def malloc_bytes() -> MallocBytes | None:
    """glibc's ``mallinfo2()`` (2.33+), or ``None`` on another C library. It walks the
    free lists of every arena: a scrape's cost, not a per-call one."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return MallocBytes(in_use=info.uordblks + info.hblkhd, free=info.fordblks)


@functools.cache
def _mallinfo2() -> Callable[[], _Mallinfo2] | None:
    if not _glibc():
        return None
    function = getattr(ctypes.CDLL(None), "mallinfo2", None)  # glibc 2.33+
    if function is None:
        return None
    function.restype = _Mallinfo2
    function.argtypes = []
    return cast("Callable[[], _Mallinfo2]", function)
