"""The gateway process's memory settings: glibc's malloc arenas capped at start unless the
operator chose a number, its figures, and the GC thresholds."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from busmq_gateway.__main__ import GC_THRESHOLDS, gc_thresholds
from busmq_gateway.allocator import cap_malloc_arenas, malloc_bytes

PROBE = "from busmq_gateway.allocator import cap_malloc_arenas; print(cap_malloc_arenas())"


def probe(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=environment, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_the_cap_is_set_on_glibc() -> None:
    assert os.confstr("CS_GNU_LIBC_VERSION"), "this test runs on glibc"
    assert probe() == "True"


def test_an_operators_malloc_arena_max_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert cap_malloc_arenas() is False
    assert probe(MALLOC_ARENA_MAX="4") == "False"


def test_malloc_bytes_reads_glibcs_figures() -> None:
    before = malloc_bytes()
    assert before is not None, "this test runs on glibc"
    block = ctypes.create_string_buffer(8 * 2**20)  # malloc'd by ctypes, 8 MiB
    during = malloc_bytes()
    assert during is not None
    assert during.in_use - before.in_use >= 8 * 2**20
    assert during.free >= 0
    del block


def test_gc_thresholds_come_from_the_environment_or_the_gateways_own() -> None:
    assert gc_thresholds(None) == GC_THRESHOLDS
    assert gc_thresholds("700,10,10") == (700, 10, 10)
    for bad in ("700,10", "a,b,c", "1,2,-3"):
        with pytest.raises(ValueError, match="BUSMQ_GATEWAY_GC_THRESHOLDS"):
            gc_thresholds(bad)
