from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.sentinel import SentinelGroup


@pytest.fixture
async def sentinel_group(tmp_path: Path) -> AsyncIterator[SentinelGroup]:
    """A master, two replicas and three Sentinels."""
    async with SentinelGroup(tmp_path / "sentinel") as group:
        yield group
