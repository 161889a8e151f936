"""The C allocator's arenas, capped for a gateway process.

glibc's malloc gives a thread that finds the heap busy an arena of its own (up to eight
per core) and returns little of a thread arena's freed memory to the system. grpc's
C-core threads allocate per call and per connection, so under load each of them grew an
arena whose freed space stayed in the RSS: 20 rounds of 1,000 streams on new connections
(``tests/gateway/test_soak.py``) with both cores busy grew the RSS by 15.4 MiB while
malloc's bytes in use stayed level (thread arenas holding 7-10 MB each, 0.1-0.4 MB of
it in use). With two arenas the same run grew 2.8 MiB. ``MALLOC_ARENA_MAX`` in the
environment, glibc's own knob, wins over this.
"""

from __future__ import annotations

import ctypes
import os

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
