"""The dashboard's queue pages over HTTP (the browser test is in test_dashboard.py):
an hour of charts sampled by the gateway, stored messages and dead letters for admins,
actions allowed only to a principal with the admin grant on the queue, each logged."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from busmq import Bus, JsonSchema
from tests.support.dashboard import ADMIN_SECRET, VIEWER_SECRET, admin_gateway, with_dead_letters
from tests.support.redis_server import RedisServer


@pytest.fixture
async def served(redis_server: RedisServer) -> AsyncIterator[tuple[Bus, str]]:
    async with admin_gateway(redis_server.url) as (bus, root):
        yield bus, root + "api/queue"


def on(base: str, path: str, name: str = "orders", query: str = "") -> str:
    """The URL of ``path`` of the queue-page API for queue ``name`` (given URL-encoded)."""
    return f"{base}{path}?name={name}{query}"


async def call(
    method: str, url: str, secret: str | None = None, body: Any = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    if method == "POST" and body is None:
        body = {}  # the page always sends JSON (web_guard refuses other bodies)
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, headers=headers, json=body) as response,
    ):
        return response.status, await response.json()


async def test_actions_need_the_admin_grant_and_are_logged(
    served: tuple[Bus, str], caplog: pytest.LogCaptureFixture
) -> None:
    bus, base = served
    await with_dead_letters(bus)
    orders = bus.queue("orders")

    # Reading the figures is open on loopback; messages and actions are not.
    status, info = await call("GET", on(base, ""))
    assert status == 200 and info["dead_letters"] == 2 and info["paused"] is False
    assert (await call("GET", on(base, "/dead")))[0] == 401
    assert (await call("POST", on(base, "/pause")))[0] == 401
    assert (await call("POST", on(base, "/pause"), "not-a-known-secret-at-all"))[0] == 401
    status, body = await call("POST", on(base, "/pause"), VIEWER_SECRET)
    assert status == 403 and "viewer" in body["error"]
    assert (await orders.info()).paused is False

    caplog.set_level(logging.INFO, logger="busmq_gateway.dashboard")
    status, dead = await call("GET", on(base, "/dead"), ADMIN_SECRET)
    assert status == 200
    reasons = [(m["payload"], m["headers"]["busmq-dead-reason"]) for m in dead["messages"]]
    assert reasons == [("a", "rejected"), ("b", "rejected")]
    assert dead["messages"][0]["headers"]["busmq-dead-error"] == "bad payload"
    status, stored = await call("GET", on(base, "/messages", "orders", "&limit=1"), ADMIN_SECRET)
    assert status == 200 and stored["more"] is True
    assert [m["payload"] for m in stored["messages"]] == ["c"]

    assert await call("POST", on(base, "/pause"), ADMIN_SECRET) == (200, {"paused": True})
    assert (await orders.info()).paused is True
    status, body = await call(
        "POST", on(base, "/rate-limit"), ADMIN_SECRET, {"limit": 5, "per_seconds": 2}
    )
    assert status == 200
    limit = (await orders.info()).rate_limit
    assert limit is not None and (limit.limit, limit.per_seconds) == (5, 2.0)
    first_dead = dead["messages"][0]["id"]
    status, body = await call(
        "POST", on(base, "/dead/requeue"), ADMIN_SECRET, {"ids": [first_dead]}
    )
    assert status == 200 and body["requeued"] == 1
    assert await call("POST", on(base, "/dead/purge"), ADMIN_SECRET) == (
        200,
        {"purged": 1},
    )
    info_after = await orders.info()
    assert (info_after.dead_letters, info_after.count) == (0, 3)  # c, d and a requeued
    assert await call("POST", on(base, "/resume"), ADMIN_SECRET) == (
        200,
        {"paused": False},
    )

    logged = [r.getMessage() for r in caplog.records if r.name == "busmq_gateway.dashboard"]
    assert any("pause on queue 'orders' by principal 'ops'" in line for line in logged)
    assert any("purge dead on queue 'orders' by principal 'ops'" in line for line in logged)
    assert not any("browse" in line for line in logged)  # reads are not actions


async def test_bad_requests_get_clear_errors_and_nothing_changes(served: tuple[Bus, str]) -> None:
    bus, base = served
    await with_dead_letters(bus)
    # A grant on orders* is not one on other queues.
    other = bus.queue("payments")
    await other.attach(ttl=60)
    assert (await call("POST", on(base, "/pause", "payments"), ADMIN_SECRET))[0] == 403
    assert (await call("POST", on(base, "/pause", "orders-missing"), ADMIN_SECRET))[0] == 404
    assert (await call("GET", on(base, "", "orders-missing")))[0] == 404
    status, body = await call("POST", on(base, "/rate-limit"), ADMIN_SECRET, {"limit": 0})
    assert status == 400 and "limit" in body["error"]
    status, body = await call("POST", on(base, "/dead/requeue"), ADMIN_SECRET, {"ids": "all"})
    assert status == 400
    status, body = await call("GET", on(base, "/messages", "orders", "&limit=x"), ADMIN_SECRET)
    assert status == 400
    info = await bus.queue("orders").info()
    assert (info.rate_limit, info.dead_letters, info.paused) == (None, 2, False)
    assert (await call("GET", on(base, "", "")))[0] == 400
    status, body = await call("POST", on(base, "/pause", "bad%20name"), ADMIN_SECRET)
    assert status == 400 and "bad name" in body["error"]


async def test_a_queue_whose_name_holds_a_slash_has_its_page(served: tuple[Bus, str]) -> None:
    bus, base = served
    eu = bus.queue("orders/eu")
    await eu.attach(ttl=60)
    await eu.push("x")
    status, info = await call("GET", on(base, "", "orders%2Feu"))
    assert status == 200 and (info["name"], info["count"]) == ("orders/eu", 1)
    assert await call("POST", on(base, "/pause", "orders%2Feu"), ADMIN_SECRET) == (
        200,
        {"paused": True},
    )
    assert (await eu.info()).paused is True


async def test_the_charts_hold_what_the_queue_went_through(served: tuple[Bus, str]) -> None:
    bus, base = served
    orders = bus.queue("orders")
    await orders.attach(ttl=60)

    async def history() -> dict[str, list[float]]:
        status, info = await call("GET", on(base, ""))
        assert status == 200 and info["history_interval"] == 0.05
        return info["history"] or {"t": [], "depth": []}

    async def until(predicate: Any) -> dict[str, list[float]]:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            h = await history()
            if predicate(h):
                return h
            await asyncio.sleep(0.02)  # polling the page as a browser would
        raise AssertionError(f"history never matched: {await history()}")

    await until(lambda h: len(h["t"]) >= 2 and h["depth"][-1] == 0)
    await orders.push_batch([str(i) for i in range(7)])
    h = await until(lambda h: h["depth"][-1] == 7)
    assert max(h["push_rate"]) > 0 and h["t"] == sorted(h["t"])
    assert 0 in h["depth"]  # the hour before the push is in the chart too


async def test_the_page_shows_the_schema_enforced(served: tuple[Bus, str]) -> None:
    bus, base = served
    checked = bus.queue("checked")
    await checked.attach(ttl=60)
    status, info = await call("GET", on(base, "", "checked"))
    assert status == 200 and info["schema"] is None
    await checked.set_schema(JsonSchema({"type": "object", "required": ["id"]}))
    status, info = await call("GET", on(base, "", "checked"))
    assert info["schema"] == {
        "version": 1,
        "versions": 1,
        "compatibility": "BACKWARD",
        "document": {"type": "object", "required": ["id"]},
    }
