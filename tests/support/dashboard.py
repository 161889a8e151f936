"""A gateway for the dashboard's queue-page tests: an admin principal ("ops", every verb
on ``orders*``), a viewer without the admin grant, charts sampled every 50 ms, and a
queue ``orders`` with two dead letters on demand."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from busmq import Bus, Mode
from busmq_gateway import Gateway, GatewaySettings
from busmq_gateway.principals import ALL_VERBS, Grant, Kind, Principal, Verb
from tests.conftest import fast_settings

ADMIN_SECRET = "queue-pages-admin-0123456789"
VIEWER_SECRET = "queue-pages-viewer-0123456789"
PRINCIPALS = (
    Principal(
        "ops", (ADMIN_SECRET,), grants=(Grant(Kind.QUEUE, ("orders*",), ALL_VERBS),), metrics=True
    ),
    Principal(
        "viewer",
        (VIEWER_SECRET,),
        grants=(Grant(Kind.QUEUE, ("*",), frozenset({Verb.CONSUME, Verb.ACK})),),
        metrics=True,
    ),
)


@contextlib.asynccontextmanager
async def admin_gateway(
    redis_url: str, allowed_hosts: tuple[str, ...] = ()
) -> AsyncIterator[tuple[Bus, str]]:
    """A bus and a gateway serving it with an HTTP listener (answering ``allowed_hosts``
    too); yields the bus and the listener's root URL."""
    bus = Bus(fast_settings([redis_url]))
    await bus.connect()
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        principals=PRINCIPALS,
        bus=bus.settings,
        http_listen="127.0.0.1:0",
        http_allowed_hosts=allowed_hosts,
        history_seconds=0.05,
        metrics_cache_seconds=0.05,
    )
    gateway = Gateway(settings, bus=bus)
    await gateway.start()
    assert gateway.http is not None
    try:
        yield bus, f"http://127.0.0.1:{gateway.http.port}/"
    finally:
        await gateway.stop()
        await bus.close()


async def with_dead_letters(bus: Bus) -> None:
    """Queue ``orders``: a, b rejected (dead letters), c and d stored."""
    orders = bus.queue("orders")
    await orders.attach(ttl=60)
    await orders.push_batch(["a", "b", "c", "d"])
    async with orders.consume(Mode.AT_LEAST_ONCE, max=2) as consumer:
        await (await consumer.__anext__()).reject("bad payload")
        await (await consumer.__anext__()).reject("worse payload")
