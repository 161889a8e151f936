"""The durable outbox: survives a killed process, drains in order, dedupes, is bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from busmq import Bus, Mode
from busmq.federation import (
    LinkState,
    Outbox,
    OutboxFullError,
    OutboxLockedError,
)
from tests.federation.conftest import SECRET, DatacenterA, MakeB
from tests.support.processes import HelperProcess
from tests.support.waiting import eventually


async def read_all(bus: Bus, name: str, count: int) -> list[bytes]:
    payloads: list[bytes] = []
    async with bus.queue(name).consume(Mode.AT_MOST_ONCE, max=count) as consumer:
        async for delivery in consumer:
            payloads.append(delivery.payload)
    return payloads


async def test_outbox_survives_a_killed_process_and_drains_in_order_once_the_gateway_is_back(
    dc_a: DatacenterA, tmp_path: Path
) -> None:
    local = dc_a.bus.queue("orders")
    await local.attach(ttl=120)
    await dc_a.gateway.stop()  # DC-A's gateway is down from the start
    outbox = str(tmp_path / "b-outbox.sqlite3")
    args = (dc_a.redis.url, dc_a.url, outbox, "orders", "--secret", SECRET)
    pusher = await HelperProcess("federation_worker", "push", *args, "--count", "2000").start()
    try:
        done = await pusher.read_until("event", "done", timeout=20)
        assert done["outbox_depth"] == 2000
        assert all(r["ids"] is None for r in pusher.records if r["event"] == "pushed")
        pusher.kill()  # no goodbye: only the SQLite file remains
        await pusher.wait()
    finally:
        await pusher.stop()

    drainer = await HelperProcess("federation_worker", "drain", *args).start()
    try:
        started = await drainer.read_until("event", "started", timeout=20)
        assert started["outbox_depth"] == 2000  # everything survived the kill
        await dc_a.gateway.start()
        drained = await drainer.read_until("event", "drained", timeout=20)
        assert drained["forwarded"] == 2000
        assert await drainer.wait() == 0
    finally:
        await drainer.stop()

    assert await local.last_id() == 2000  # nothing stored twice
    assert await read_all(dc_a.bus, "orders", 2000) == [b"%d" % i for i in range(2000)]


async def test_a_push_resent_from_the_outbox_is_stored_once(dc_a: DatacenterA, dc_b: Bus) -> None:
    local = dc_a.bus.queue("payments")
    await local.attach(ttl=120)
    remote = dc_b.federate("payments", dc_a.url)
    assert await remote.push("first", request_id="payment-1") == 1
    # The same push again after an "ambiguous failure", this time through the outbox.
    await dc_a.proxy.cut()
    assert await remote.push("first", request_id="payment-1") is None
    assert await remote.push("second", request_id="payment-2") is None
    assert remote.outbox_depth == 2
    await dc_a.proxy.restore()
    await eventually(lambda: remote.outbox_depth == 0, what="outbox drained")
    assert await local.last_id() == 2
    assert await read_all(dc_a.bus, "payments", 2) == [b"first", b"second"]
    assert remote.pushed == 2


async def test_a_full_outbox_refuses_pushes_with_a_typed_error(
    dc_a: DatacenterA, make_b: MakeB
) -> None:
    await dc_a.bus.queue("bounded").attach(ttl=120)
    bus = await make_b(outbox_max_messages=100)
    remote = bus.federate("bounded", dc_a.url)
    assert await remote.link.wait_usable(10)
    await dc_a.proxy.cut()
    for i in range(10):
        assert await remote.push_batch([f"{i}.{j}" for j in range(10)]) is None
    with pytest.raises(OutboxFullError) as error:
        await remote.push("one too many")
    assert error.value.reason == "max_messages" and error.value.queue == "bounded"
    assert remote.link.outbox_depth == 100 and remote.link.outbox_rows == 10
    await dc_a.proxy.restore()
    await eventually(lambda: remote.outbox_depth == 0, what="outbox drained")
    assert remote.state is LinkState.READY
    assert await remote.push("fits again") == 101


async def test_the_outbox_file_keeps_rows_across_reopening_and_refuses_a_second_user(
    tmp_path: Path,
) -> None:
    path = tmp_path / "outbox.sqlite3"
    first = Outbox(path, max_messages=1000, max_age=None)
    await first.open()
    seqs = [await first.append("http://a:1", "q", f"r{i}", 2, b"x%d" % i) for i in range(3)]
    assert seqs == sorted(seqs) and first.depth() == 6 and first.pending("http://a:1", "q") == 3
    with pytest.raises(OutboxLockedError):
        Outbox(path, max_messages=1000, max_age=None).lock()
    await first.close()

    again = Outbox(path, max_messages=1000, max_age=0.001)
    await again.open()
    rows = await again.head("http://a:1", 10)
    assert [r.request_id for r in rows] == ["r0", "r1", "r2"]
    assert [r.messages for r in rows] == [b"x0", b"x1", b"x2"]
    with pytest.raises(OutboxFullError) as error:  # the oldest row is older than max_age
        await again.append("http://a:1", "q", "r3", 1, b"x3")
    assert error.value.reason == "max_age"
    await again.remove(rows[:2])
    await again.dead_letter(rows[2], "refused")
    assert again.depth() == 0 and [d.row.request_id for d in await again.dead_letters()] == ["r2"]
    await again.close()
