from busmq import Bus, Mode


async def test_push_then_consume_at_most_once(bus: Bus) -> None:
    async with bus.queue("smoke") as queue:
        ids = await queue.push_batch([b"a", "b", {"c": 1}])
        assert ids == [1, 2, 3]
        got = []
        async with queue.consume(Mode.AT_MOST_ONCE, max=3) as consumer:
            async for delivery in consumer:
                got.append((delivery.id, delivery.data))
        assert got == [(1, b"a"), (2, "b"), (3, {"c": 1})]
        assert await queue.count() == 0
