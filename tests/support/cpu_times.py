"""``BUSMQ_TEST_CPU=path``: each test's CPU seconds (this process's and its reaped
children's: the redis-servers, gateways and workers it started), its start and end on the
wall clock and its pytest-xdist worker, appended to ``path`` as JSON lines, for finding
what makes the suite slow on a machine of few cores (and where the workers sat idle)."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator

import pytest


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    path = os.environ.get("BUSMQ_TEST_CPU")
    if not path:
        return (yield)
    started, wall = _cpu(), time.time()
    try:
        return (yield)
    finally:
        row = {
            "test": item.nodeid,
            "cpu": round(_cpu() - started, 3),
            "start": round(wall, 3),
            "end": round(time.time(), 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        }
        with open(path, "a") as log:
            log.write(json.dumps(row) + "\n")
