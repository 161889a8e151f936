"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright.

A gateway serves a bus that federates to another datacenter's gateway. The page must
show the bus's queues and the federation link, and follow what happens: a push, the
other gateway going away. The screenshot is kept in ``test-artifacts/dashboard.png``
(``BUSMQ_TEST_ARTIFACTS`` to put it elsewhere).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page

from busmq import Bus, JsonSchema, Mode
from busmq.federation import FederationSettings, FederationTarget
from busmq_gateway import Gateway, GatewaySettings
from tests.conftest import fast_settings
from tests.federation.conftest import FAST_LINK
from tests.support.dashboard import ADMIN_SECRET, VIEWER_SECRET, admin_gateway, with_dead_letters
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer

ARTIFACTS = Path(
    os.environ.get("BUSMQ_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts")
)
SECRET = "dashboard-secret-0123456789"


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


async def cell(page: Page, table: str, row: str, column: int) -> str:
    return await page.inner_text(f'#{table} tr[data-name="{row}"] td:nth-child({column})')


async def until_text(
    page: Page, selector: str, text: str, *, equal: bool = True, timeout: float = 10
) -> None:
    """Wait until the page itself (no reload) shows ``text`` at ``selector`` (or, with
    ``equal=False``, anything else)."""
    await page.wait_for_function(
        "([selector, text, equal]) =>"
        " (document.querySelector(selector)?.textContent === text) === equal",
        arg=[selector, text, equal],
        timeout=timeout * 1000,
    )


async def test_dashboard_shows_queues_and_links_and_follows_changes(
    browser: Browser, artifacts: Path, tmp_path: Path
) -> None:
    async with (
        RedisServer(tmp_path / "remote-redis") as remote_redis,
        RedisServer(tmp_path / "redis") as redis,
    ):
        remote = GatewayProcess(remote_redis.url, (SECRET,))
        await remote.start()
        bus = Bus(fast_settings([redis.url]))
        await bus.connect()
        target = FederationTarget(f"http://{remote.target}", secret=SECRET)
        outbox = tmp_path / "outbox.sqlite3"
        bus.configure_federation(
            FederationSettings(targets=[target], outbox_path=outbox, **FAST_LINK)
        )
        settings = GatewaySettings(
            listen="127.0.0.1:0",
            secrets=(SECRET,),
            bus=bus.settings,
            http_listen="127.0.0.1:0",
            history_seconds=0.2,
        )
        gateway = Gateway(settings, bus=bus)
        await gateway.start()
        try:
            orders = bus.queue("orders")
            await orders.attach(ttl=60)
            await orders.push_batch(["a", "b", "c", "d", "e", "f"])
            async with orders.consume(Mode.AT_LEAST_ONCE, max=3) as consumer:
                await (await consumer.__anext__()).ack()
                await (await consumer.__anext__()).reject("bad payload")
                await consumer.__anext__()  # left unacked
            federated = bus.federate("remote-orders", target.url)
            await federated.attach(ttl=60)
            await federated.push("x")

            assert gateway.http is not None
            page = await browser.new_page(viewport={"width": 1280, "height": 720})
            await page.goto(f"http://127.0.0.1:{gateway.http.port}/")
            await page.wait_for_selector('#queues tr[data-name="orders"]')
            assert await cell(page, "queues", "orders", 2) == "3"  # depth
            assert await cell(page, "queues", "orders", 5) == "1"  # pending
            assert await cell(page, "queues", "orders", 9) == "1"  # dead letters
            await page.wait_for_selector(f'#federation tr[data-name="{target.url}"]')
            assert await cell(page, "federation", target.url, 2) == "ready"
            assert (await page.inner_text("#shards")).count("online") == 1
            # The link's hour is charted: its state (1: up) and outbox, sample by sample.
            up_chart = f'[data-chart="link:{target.url}:up"]'
            await page.wait_for_function(
                "(s) => Number(document.querySelector(s)?.dataset.points) >= 2", arg=up_chart
            )
            assert await page.get_attribute(up_chart, "data-last") == "1"
            await page.screenshot(path=artifacts / "dashboard.png", full_page=True)

            # The page refreshes itself: a push shows up without a reload...
            await orders.push_batch(["g", "h"])
            await until_text(page, '#queues tr[data-name="orders"] td:nth-child(2)', "5")
            # ...and so does the other datacenter's gateway going away.
            await remote.stop()
            state = f'#federation tr[data-name="{target.url}"] td:nth-child(2)'
            await until_text(page, state, "ready", equal=False, timeout=15)
            assert await cell(page, "federation", target.url, 2) in ("connecting", "disconnected")
            await page.wait_for_function(  # and the link's chart drops to 0
                "(s) => document.querySelector(s)?.dataset.last === '0'", arg=up_chart
            )
            assert int(await page.get_attribute("body", "data-updates") or 0) >= 3
        finally:
            await gateway.stop()
            await bus.close()
            await remote.stop()


async def test_queue_page_charts_its_hour_and_takes_admin_actions(
    browser: Browser, artifacts: Path, redis_server: RedisServer
) -> None:
    async with admin_gateway(redis_server.url) as (bus, root):
        await with_dead_letters(bus)
        orders = bus.queue("orders")
        # Ordered per customer: e holds key c1 (read, then given back), f waits for it.
        await orders.set_ordering("customer")
        await orders.push_batch([("e", {"customer": "c1"}), ("f", {"customer": "c1"})])
        async with orders.consume(Mode.AT_LEAST_ONCE, max=4) as consumer:  # reads c d e f
            await consumer.__anext__()
        page = await browser.new_page(viewport={"width": 1280, "height": 1100})
        page.on("dialog", lambda dialog: dialog.accept())  # "remove every dead letter?"
        await page.goto(root)
        await page.click('#queues tr[data-name="orders"] a')
        await until_text(page, "#q-name", "orders")
        # The charts fill from the gateway's samples, without a reload.
        await page.wait_for_selector('[data-chart="queue:depth"] canvas')
        await page.wait_for_function(
            "() => Number("
            "document.querySelector('[data-chart=\"queue:depth\"]').dataset.points) >= 3"
        )
        await page.wait_for_function(
            "() => document.querySelector('#q-ordering').textContent"
            ".startsWith('by customer: 1 keys in flight, 1 waiting, oldest ')"
        )
        # Without a secret, nothing of the messages is shown.
        await page.wait_for_selector("#dead td.empty")
        assert "needs an admin secret" in await page.inner_text("#dead")

        # A principal without the admin grant is refused, and nothing changes.
        await page.fill("#secret", VIEWER_SECRET)
        await page.dispatch_event("#secret", "change")
        await page.click("#q-pause")
        await page.wait_for_function(
            "() => document.querySelector('#action-status').textContent.startsWith('refused')"
        )
        assert "refused: principal 'viewer'" in await page.inner_text("#action-status")
        assert (await orders.info()).paused is False

        # The admin sees the dead letters with their reasons, and acts.
        await page.fill("#secret", ADMIN_SECRET)
        await page.dispatch_event("#secret", "change")
        await page.wait_for_selector("#dead tbody tr:nth-child(2) td:nth-child(2)")
        assert await page.inner_text("#dead tbody tr:first-child td:nth-child(2)") == "rejected"
        assert await page.inner_text("#dead tbody tr:first-child td:nth-child(3)") == "bad payload"
        await page.wait_for_selector('#messages tbody tr[data-name="3"]')  # c, the first stored
        assert await page.inner_text("#messages tbody tr:first-child td:nth-child(5)") == "c"
        await page.click("#q-pause")
        await until_text(page, "#q-state", "paused")
        assert (await orders.info()).paused is True
        await page.fill("#q-rate-limit", "5")
        await page.click("#q-rate-set")
        await until_text(page, "#q-rate", "5 per 1 s")
        await page.click("#dead tbody tr:first-child button")  # requeue that one
        # Functions, not expressions: the page's CSP forbids eval, which Playwright
        # uses for an expression.
        await page.wait_for_function(
            "() => document.querySelectorAll('#dead tbody tr').length === 1"
        )
        await page.screenshot(path=artifacts / "dashboard-queue.png", full_page=True)
        await page.click("#dead-purge")
        await page.wait_for_selector("#dead td.empty")
        info = await orders.info()
        assert (info.paused, info.dead_letters, info.count) == (True, 0, 5)  # c d e f, and a
        await orders.set_schema(JsonSchema({"type": "object"}))  # shown without a reload
        await until_text(page, "#q-schema", "version 1 of 1 (BACKWARD)")
        assert await page.get_attribute("#q-schema", "title") == '{\n  "type": "object"\n}'
        assert info.rate_limit is not None and info.rate_limit.limit == 5
