"""Waiting for a condition with a deadline, instead of sleeping a guessed time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll ``check`` until it returns true; fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(interval)  # the poll interval


async def take(deliveries: AsyncIterator[T], n: int, timeout: float = 10.0) -> list[T]:
    """The next ``n`` deliveries of a consumer, or a ``TimeoutError`` after ``timeout``."""
    got: list[T] = []
    async with asyncio.timeout(timeout):
        async for delivery in deliveries:
            got.append(delivery)
            if len(got) == n:
                break
    return got
