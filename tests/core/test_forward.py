"""Forwarding a delivery (consume -> transform -> push -> ack) stores its messages in the
target exactly once: in one script when both queues are on one server, through the
source queue's outbox otherwise (another server or bus here; a federated queue in
tests/federation/test_forward.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from busmq import Bus, Mode, QueueNotFoundError, Request
from busmq.channel import Channel
from busmq.keys import QueueKeys
from tests.support.redis_server import RedisServer
from tests.support.waiting import take


@pytest.fixture
async def other_bus(tmp_path: Path, make_bus: Callable[..., Any]) -> Any:
    """A bus on a Redis server of its own: a target there is reached through the outbox."""
    async with RedisServer(tmp_path / "other") as server:
        yield await make_bus([server.url])


async def _stored(queue: Any) -> list[Any]:
    return [message.data async for message in queue.browse()]


async def test_a_forward_stores_the_messages_and_acks_the_delivery(bus: Bus) -> None:
    async with bus.queue("fw-src") as src, bus.queue("fw-dst") as dst:
        await src.push_batch([1, 2, 3])
        async with src.consume(Mode.AT_LEAST_ONCE, max=3) as consumer:
            async for delivery in consumer:
                assert await delivery.forward(dst, {"n": delivery.data * 10}, headers={"k": "v"})
        assert [m.headers async for m in dst.browse()] == [{"k": "v"}] * 3
        assert await _stored(dst) == [{"n": 10}, {"n": 20}, {"n": 30}]
        info = await src.info()
        assert info.count == 0 and info.pending == 0


async def test_a_delivery_settled_by_an_earlier_holder_stores_nothing(bus: Bus) -> None:
    """The first holder's lease runs out and a second consumer takes the message over
    and forwards it; the first holder's late forward stores nothing."""
    async with bus.queue("fw-late") as src, bus.queue("fw-late-out") as dst:
        await src.push("m")
        # max=1: the first holder reads no more, so it does not claim the message back.
        async with src.consume(Mode.AT_LEAST_ONCE, visibility_timeout=0.3, max=1) as first:
            stale = await anext(first)
            async with src.consume(Mode.AT_LEAST_ONCE, visibility_timeout=0.3) as second:
                taken = await anext(second)
                assert taken.id == stale.id and taken.redelivered
                assert await taken.forward(dst, "from the second")
            assert not await stale.forward(dst, "from the first")
        assert await _stored(dst) == ["from the second"]


async def test_a_forward_batch_stores_all_or_nothing_and_an_empty_one_acks(bus: Bus) -> None:
    async with bus.queue("fw-batch") as src, bus.queue("fw-batch-out") as dst:
        await src.push_batch(["a", "b"])
        async with src.consume(Mode.AT_LEAST_ONCE, max=2) as consumer:
            deliveries = [d async for d in consumer]
        assert await deliveries[0].forward_batch(dst, ["a1", ("a2", {"h": "1"}), b"a3"])
        assert await deliveries[1].forward_batch(dst, [])
        assert await _stored(dst) == ["a1", "a2", b"a3"]
        assert (await src.info()).pending == 0
        with pytest.raises(ValueError, match="at most 1000"):
            await deliveries[0].forward_batch(dst, [b"x"] * 1001)


async def test_a_missing_target_leaves_the_delivery_pending(bus: Bus) -> None:
    async with bus.queue("fw-orphan") as src:
        await src.push("m")
        async with src.consume(Mode.AT_LEAST_ONCE) as consumer:
            delivery = await anext(consumer)
            with pytest.raises(QueueNotFoundError):
                await delivery.forward(bus.queue("fw-nowhere"), "x")
            assert (await src.info()).pending == 1
            async with bus.queue("fw-nowhere") as dst:
                assert await delivery.forward(dst, "x")
                assert await _stored(dst) == ["x"]


async def test_an_at_most_once_delivery_forwards_as_a_plain_push(bus: Bus) -> None:
    async with bus.queue("fw-amo") as src, bus.queue("fw-amo-out") as dst:
        await src.push("m")
        async with src.consume(Mode.AT_MOST_ONCE, max=1) as consumer:
            async for delivery in consumer:
                assert await delivery.forward(dst, "m!")
        assert await _stored(dst) == ["m!"]


async def test_one_server_forwards_in_one_script_with_no_outbox(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    bus = await make_bus([redis_server.url])
    async with bus.queue("fw-one") as src, bus.queue("fw-one-out") as dst:
        await src.push_batch(list(range(20)))
        async with src.consume(Mode.AT_LEAST_ONCE, max=20) as consumer:
            async for delivery in consumer:
                await delivery.forward(dst, delivery.data)
        assert await _stored(dst) == list(range(20))
        client = redis_server.client()
        assert not await client.exists(QueueKeys("fw-one").outbox)
        await client.aclose()


async def test_through_the_outbox_a_redelivery_reuses_what_its_first_forward_recorded(
    bus: Bus, other_bus: Bus
) -> None:
    """The first forward records its message and fails on the missing target (as if the
    process died there); the redelivery's handler makes a different message, but the
    target stores the first one, once."""
    async with bus.queue("fw-out-src") as src:
        await src.push("m")
        remote = other_bus.queue("fw-out-dst")
        async with src.consume(Mode.AT_LEAST_ONCE, visibility_timeout=0.3) as consumer:
            first = await anext(consumer)
            with pytest.raises(QueueNotFoundError):
                await first.forward(remote, "first try")
            async with remote:
                again = await anext(consumer)
                assert again.id == first.id and again.redelivered
                assert await again.forward(remote, "second try")
                assert not await first.forward(remote, "first try, late")
            assert await _stored(remote) == ["first try"]
        info = await src.info()
        assert info.count == 0 and info.pending == 0


async def test_competing_consumers_forward_through_the_outbox_exactly_once(
    bus: Bus, other_bus: Bus
) -> None:
    count = 300
    async with bus.queue("fw-many") as src, other_bus.queue("fw-many-out") as dst:
        await src.push_batch(list(range(count)))
        forwarded: list[int] = []
        done = asyncio.Event()

        async def worker() -> None:
            async with src.consume(Mode.AT_LEAST_ONCE, prefetch=5) as consumer:
                async for delivery in consumer:
                    if await delivery.forward(dst, {"from": delivery.id, "v": delivery.data}):
                        forwarded.append(delivery.id)
                    if len(forwarded) == count:
                        done.set()

        workers = [asyncio.create_task(worker()) for _ in range(3)]
        await asyncio.wait_for(done.wait(), 60)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        assert len(set(forwarded)) == count
        stored = await _stored(dst)
        assert sorted(m["v"] for m in stored) == list(range(count))
        assert (await src.info()).pending == 0


async def test_a_channel_delivery_forwards_and_is_not_redelivered(bus: Bus) -> None:
    sender, receiver = Channel(bus, "fw-chan"), Channel(bus, "fw-chan")
    await sender.connect()
    for i in range(5):
        await sender.send(i)
    await receiver.listen(Mode.AT_LEAST_ONCE, visibility_timeout=0.5)
    async with bus.queue("fw-chan-out") as dst:
        for delivery in await take(receiver, 5):
            assert await delivery.forward(dst, delivery.data * 2)
        await receiver.disconnect()
        again = Channel(bus, "fw-chan")
        await again.listen(Mode.AT_LEAST_ONCE, visibility_timeout=0.5)
        await sender.send("after")
        assert [d.data for d in await take(again, 1)] == ["after"]  # nothing came back
        assert await _stored(dst) == [0, 2, 4, 6, 8]
        await asyncio.gather(sender.disconnect(), again.disconnect())


async def test_forwards_without_ack_store_once_per_target_until_the_delivery_is_acked(
    bus: Bus, other_bus: Bus
) -> None:
    async with bus.queue("fw-fan") as src, bus.queue("fw-fan-a") as near:
        far = other_bus.queue("fw-fan-b")
        await far.attach()
        await src.push("m")
        async with src.consume(Mode.AT_LEAST_ONCE, visibility_timeout=0.3) as consumer:
            first = await anext(consumer)
            assert await first.forward(near, "to a", ack=False)
            assert await first.forward(far, "to b", ack=False)
            again = await anext(consumer)  # its lease ran out: the handler runs again
            assert again.id == first.id
            assert await again.forward(near, "to a, second run", ack=False)
            assert await again.forward(far, "to b, second run", ack=False)
            assert await again.ack()
            assert not await first.forward(far, "late", ack=False)
        assert await _stored(near) == ["to a"]
        assert await _stored(far) == ["to b"]
        assert (await src.info()).pending == 0


async def test_a_service_request_forwards_once_however_often_it_is_handled(bus: Bus) -> None:
    """The first handler forwards and never replies (its run is cancelled, which gives
    the request back, as a handler process dying does after its lease); the second
    handler's forward stores nothing more, and its reply settles the request."""
    forwarded = asyncio.Event()
    async with bus.queue("fw-audit") as audit, bus.service("fw-billing") as billing:

        async def stalls(request: Request) -> Any:
            await request.forward(audit, {"charged": request.data, "run": 1})
            forwarded.set()
            await asyncio.Event().wait()

        async def answers(request: Request) -> Any:
            assert request.redelivered
            assert await request.forward(audit, {"charged": request.data, "run": 2})
            return "ok"

        first = asyncio.create_task(billing.serve(stalls, visibility_timeout=0.5))
        reply = asyncio.create_task(billing.request(30, timeout=20))
        await asyncio.wait_for(forwarded.wait(), 10)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        second = asyncio.create_task(billing.serve(answers, visibility_timeout=0.5))
        assert await reply == "ok"
        billing.stop_serving()
        await second
        assert await _stored(audit) == [{"charged": 30, "run": 1}]
