"""The durable outbox: survives a killed process, drains in order, dedupes, is bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from busmq import Bus, Mode
from busmq.federation import (
    DeadLetter,
    FederationSettings,
    FederationTarget,
    LinkState,
    Outbox,
    OutboxFullError,
    OutboxLockedError,
)
from tests.conftest import fast_settings
from tests.federation.conftest import FAST_LINK, SECRET, DatacenterA, MakeB
from tests.support.processes import HelperProcess
from tests.support.redis_server import RedisServer
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


async def test_dead_letters_are_requeued_once_their_queue_exists_and_arrive_exactly_once(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    manager = dc_b.federation
    assert manager is not None
    late = dc_b.federate("late", dc_a.url)
    gone = dc_b.federate("gone", dc_a.url)
    dead_events: list[tuple[str, object]] = []
    late.events.on(
        lambda e: (
            dead_events.append((e.source, e.details.get("seq")))
            if e.details.get("dead_letter")
            else None
        )
    )
    assert await late.link.wait_usable(10)
    await dc_a.proxy.cut()  # so that the pushes wait in the outbox: neither queue exists in A
    assert await late.push("first", request_id="late-1") is None
    assert await late.push_batch(["second", "third"], request_id="late-2") is None
    assert await gone.push("never", request_id="gone-1") is None
    await dc_a.proxy.restore()

    async def dead() -> list[DeadLetter]:
        return await manager.dead_letters()

    async def all_dead() -> bool:
        return len(await dead()) == 3

    await eventually(all_dead, what="three pushes refused for good")
    assert late.outbox_depth == gone.outbox_depth == 0
    letters = await dead()
    assert [(d.row.queue, d.row.request_id) for d in letters] == [
        ("late", "late-1"),
        ("late", "late-2"),
        ("gone", "gone-1"),
    ]
    assert all("does not exist" in d.error for d in letters)
    assert [seq for _, seq in dead_events] == [d.row.seq for d in letters[:2]]

    local = dc_a.bus.queue("late")
    await local.attach(ttl=120)
    # The first push was stored after all (say its Push succeeded but the answer was
    # lost): the requeued row carries the same request_id and is not stored twice.
    assert await late.push("first", request_id="late-1") == 1
    assert await manager.requeue_dead_letters(queue="late") == 2
    await eventually(lambda: late.outbox_depth == 0, what="requeued rows forwarded")
    assert await local.last_id() == 3  # 1 direct + 2 requeued, the duplicate not stored
    assert await read_all(dc_a.bus, "late", 3) == [b"first", b"second", b"third"]
    assert [d.row.request_id for d in await dead()] == ["gone-1"]

    assert await manager.requeue_dead_letters(queue="late") == 0  # nothing left to move
    assert await manager.discard_dead_letters(target=dc_a.url) == 1
    assert await dead() == []
    assert gone.outbox_depth == 0 and not await dc_a.bus.queue("gone").exists()


async def test_requeue_keeps_order_and_request_ids_and_respects_the_outbox_bound(
    tmp_path: Path,
) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite3", max_messages=10, max_age=None)
    await outbox.open()
    try:
        a, b = "http://a:1", "http://b:1"
        rows = []
        for target, queue, request_id, count in [
            (a, "q", "r0", 2),
            (a, "other", "r1", 1),
            (a, "q", "r2", 3),
            (b, "q", "r3", 4),
        ]:
            seq = await outbox.append(target, queue, request_id, count, request_id.encode())
            rows.append((await outbox.head(target, 10))[-1])
            assert rows[-1].seq == seq
        for row in rows:
            await outbox.dead_letter(row, "refused")
        assert outbox.depth() == 0 and len(await outbox.dead_letters()) == 4

        await outbox.append(a, "q", "live", 4, b"live")  # 4 waiting: 6 messages of room
        with pytest.raises(OutboxFullError) as full:  # 2 + 1 + 3 + 4 = 10 do not fit
            await outbox.requeue()
        assert full.value.reason == "max_messages"
        assert outbox.depth() == 4 and len(await outbox.dead_letters()) == 4  # none moved

        assert await outbox.requeue(target=a, queue="q") == 2  # r0 and r2: 5 messages
        waiting = await outbox.head(a, 10)
        assert [r.request_id for r in waiting] == ["live", "r0", "r2"]  # at the tail, in order
        assert [r.messages for r in waiting] == [b"live", b"r0", b"r2"]
        assert waiting[1].seq > rows[3].seq  # new seqs: after everything appended before
        assert outbox.depth(a) == 9 and outbox.pending(a, "q") == 3
        assert outbox.queue_depth(a, "q") == 9
        assert [d.row.request_id for d in await outbox.dead_letters()] == ["r1", "r3"]
        assert await outbox.requeue([rows[1].seq]) == 1  # exactly fills the bound
        assert outbox.depth() == 10
        assert await outbox.requeue([rows[1].seq]) == 0  # already moved

        assert await outbox.discard_dead_letters([rows[3].seq, 12345]) == 1
        assert await outbox.dead_letters() == []
        assert outbox.depth() == 10 and outbox.rows(b) == 0
    finally:
        await outbox.close()

    again = Outbox(tmp_path / "outbox.sqlite3", max_messages=10, max_age=None)
    await again.open()  # the requeued rows are durable like any other
    try:
        assert [r.request_id for r in await again.head("http://a:1", 10)] == [
            "live",
            "r0",
            "r2",
            "r1",
        ]
        assert again.depth() == 10
    finally:
        await again.close()


async def test_a_data_dir_given_as_str_places_the_default_outbox_beside_it(
    dc_a: DatacenterA, tmp_path: Path
) -> None:
    async with RedisServer(tmp_path / "b-redis") as redis:
        settings = fast_settings([redis.url], data_dir=str(tmp_path / "data" / "redis"))
        async with Bus(settings) as bus:
            assert settings.data_dir == tmp_path / "data" / "redis"
            target = FederationTarget(dc_a.url, secret=SECRET)
            bus.configure_federation(FederationSettings(targets=[target], **FAST_LINK))
            async with bus.federate(bus.queue("str-paths"), dc_a.url) as remote:
                assert await remote.push("stored") == 1
        assert (tmp_path / "data" / "outbox.sqlite3").exists()
