"""The dashboard as a hostile web page sees it: cross-site actions (CSRF) and foreign
Host names (DNS rebinding) are refused, with nothing changed and a warning logged; the
page's own requests work, and every response carries the headers a browser honours."""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from playwright.async_api import Browser

from busmq import Bus
from tests.support.dashboard import ADMIN_SECRET, admin_gateway, with_dead_letters
from tests.support.redis_server import RedisServer

ROUTES = ["/pause", "/resume", "/rate-limit", "/dead/requeue", "/dead/purge"]
BEARER = {"Authorization": f"Bearer {ADMIN_SECRET}"}
BASIC = {"Authorization": "Basic " + base64.b64encode(f"ops:{ADMIN_SECRET}".encode()).decode()}
BODY = '{"limit": 1, "per_seconds": 3600}'


@pytest.fixture
async def served(redis_server: RedisServer) -> AsyncIterator[tuple[Bus, str]]:
    async with admin_gateway(redis_server.url, ("dash.example.com",)) as (bus, root):
        await with_dead_letters(bus)
        yield bus, root.rstrip("/")


async def request(
    method: str, url: str, headers: dict[str, str], data: str | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, headers=headers, data=data) as response,
    ):
        body = await response.json() if response.content_type == "application/json" else {}
        return response.status, body, dict(response.headers)


async def state(bus: Bus) -> tuple[object, ...]:
    info = await bus.queue("orders").info()
    return info.paused, info.rate_limit, info.dead_letters, info.count


ATTACKS = {
    # rule: headers a forged request carries (the admin secret too: a page cannot send
    # it, but the rule must hold even so)
    "ORIGIN": {**BEARER, "Origin": "http://evil.example", "Content-Type": "application/json"},
    "FETCH_SITE": {**BEARER, "Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"},
    "CONTENT_TYPE": {**BEARER, "Content-Type": "application/x-www-form-urlencoded"},
    "CONTENT_TYPE ": {**BEARER, "Content-Type": "text/plain"},  # JSON as text/plain
    "BASIC_AUTH": {**BASIC, "Content-Type": "application/json"},
}


@pytest.mark.parametrize("route", ROUTES)
async def test_forged_actions_are_refused_and_change_nothing(
    served: tuple[Bus, str], route: str, caplog: pytest.LogCaptureFixture
) -> None:
    bus, root = served
    url = f"{root}/api/queue{route}?name=orders"
    before = await state(bus)
    caplog.set_level(logging.WARNING, logger="busmq_gateway.dashboard")
    for rule, headers in ATTACKS.items():
        data = "" if rule == "CONTENT_TYPE" else BODY
        status, body, _ = await request("POST", url, headers, data)
        assert (status, body.get("rule")) == (403, rule.strip()), (rule, body)
        assert await state(bus) == before, rule
    assert "Origin 'http://evil.example'" in caplog.text and "ORIGIN" in caplog.text

    # The page's own request: its origin, JSON, the bearer secret.
    own = {**BEARER, "Origin": root, "Content-Type": "application/json"}
    status, body, _ = await request("POST", url, own, "{}" if route != "/rate-limit" else BODY)
    assert status == 200, body


FOREIGN = ["/", "/api/overview", "/api/links", "/api/queue?name=orders", "/metrics",
           "/static/dashboard.js"]  # fmt: skip


async def test_only_the_listeners_own_host_names_are_answered(served: tuple[Bus, str]) -> None:
    _, root = served
    port = urlsplit(root).port
    for path in FOREIGN:
        status, body, _ = await request("GET", root + path, {"Host": f"evil.example:{port}"})
        assert (status, body.get("rule")) == (421, "HOST"), path
        status, _, _ = await request("GET", root + path, {"Host": f"localhost:{port + 1}"})
        assert status == 421, path  # the right name, another port
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "dash.example.com"):
        for path in FOREIGN:
            status, _, _ = await request("GET", root + path, {"Host": host})
            assert status == 200, (host, path)
    for path in ("/healthz", "/readyz"):
        status, _, _ = await request("GET", root + path, {"Host": "evil.example"})
        assert status == 200, path


async def test_every_response_carries_the_browser_headers(served: tuple[Bus, str]) -> None:
    _, root = served
    for path in ("/", "/api/overview", "/static/dashboard.js", "/no-such-page"):
        _, _, headers = await request("GET", root + path, {})
        csp = headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "no-referrer"


async def test_a_page_of_another_origin_cannot_pause_a_queue_through_the_browser(
    served: tuple[Bus, str],
    browser: Browser,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another local origin's page auto-submits a form to the pause action while the
    browser holds the dashboard's basic-auth credentials: refused, nothing paused."""
    bus, root = served
    form = f"""<!doctype html><form id="f" method="post" enctype="text/plain"
      action="{root}/api/queue/pause?name=orders"><input name='{{"a":"' value='"}}'></form>
      <script>document.getElementById("f").submit()</script>"""

    async def evil_page(_: web.Request) -> web.Response:
        return web.Response(text=form, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", evil_page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    evil = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    caplog.set_level(logging.WARNING, logger="busmq_gateway.dashboard")
    context = await browser.new_context(
        http_credentials={"username": "ops", "password": ADMIN_SECRET}
    )
    try:
        page = await context.new_page()
        async with page.expect_response(lambda r: "/api/queue/pause" in r.url) as answered:
            await page.goto(evil)
        response = await answered.value
        assert response.status == 403
        assert (await response.json())["rule"] == "ORIGIN"
    finally:
        await context.close()
        await runner.cleanup()
    assert (await bus.queue("orders").info()).paused is False
    assert f"Origin '{evil.rstrip('/')}'" in caplog.text
