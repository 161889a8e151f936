"""What every consumer shares, local or federated: the modes, the checks of its arguments
and the handler loop of ``run()``."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .controls import RetryPolicy
from .message import Delivery

if TYPE_CHECKING:
    from .tracing import Tracing

log = logging.getLogger(__name__)


class Mode(enum.Enum):
    """How a consumer takes messages from a queue."""

    AT_MOST_ONCE = "at_most_once"
    AT_LEAST_ONCE = "at_least_once"
    REPLAY = "replay"

    @property
    def family(self) -> str:
        """``destructive`` modes share a queue; ``replay`` readers share a queue."""
        return "replay" if self is Mode.REPLAY else "destructive"


LATEST = -1
"""``from_id`` for replay: only messages pushed after the consumer starts."""


def check_consume_arguments(
    mode: Mode,
    *,
    max: int | None,
    from_id: int,
    prefetch: int,
    visibility_timeout: float,
    max_deliveries: int | None,
    retry_policy: RetryPolicy | None,
) -> None:
    """Raise ``ValueError`` for arguments no consumer accepts (local or federated)."""
    if (max_deliveries is not None or retry_policy is not None) and (
        mode is not Mode.AT_LEAST_ONCE
    ):
        raise ValueError("max_deliveries and retry_policy apply to at-least-once consumers")
    if max_deliveries is not None and max_deliveries < 1:
        raise ValueError(f"max_deliveries must be at least 1, got {max_deliveries}")
    if max is not None and max < 1:
        raise ValueError(f"max must be at least 1, got {max}")
    if prefetch < 1:
        raise ValueError(f"prefetch must be at least 1, got {prefetch}")
    if visibility_timeout <= 0:
        raise ValueError("visibility_timeout must be positive")
    if from_id < LATEST:
        raise ValueError(f"from_id must be a message id (>= 0) or LATEST, got {from_id}")


async def handle_each(
    deliveries: AsyncIterator[Delivery],
    handler: Callable[[Delivery], Awaitable[Any]],
    queue: str,
    tracing: Tracing | None = None,
) -> None:
    """Call ``handler`` for each delivery; ack when it returns, nack when it raises (both
    are no-ops outside at-least-once). Shared by local and federated consumers. With
    ``tracing``, each call runs in a CONSUMER span (see :mod:`busmq.tracing`)."""
    async for delivery in deliveries:
        try:
            if tracing is None:
                await handler(delivery)
            else:
                with tracing.process(queue, delivery.headers, delivery.id):
                    await handler(delivery)
        except Exception:
            log.exception("handler failed on %s #%d", queue, delivery.id)
            await delivery.nack()
        else:
            await delivery.ack()


async def wait_for_wakeup(event: asyncio.Event, timeout: float, tick: float) -> None:
    """Wait for ``event`` (a consumer's wake-up) at most ``timeout`` seconds."""
    if timeout >= tick:  # the notifier sets the event at least every tick: no timer
        await event.wait()
        return
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        pass
