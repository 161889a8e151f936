"""Idempotent producers: a push numbered by its producer is stored once per queue,
producer and sequence for as long as the queue lives (no time window), and a newer
instance of a producer fences the older one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from busmq import Bus, InvalidNameError, Mode, Producer, ProducerFencedError
from busmq.keys import QueueKeys
from busmq.message import EncodedMessage, encode


async def test_a_repeated_sequence_is_stored_once_and_answers_the_original_ids(bus: Bus) -> None:
    async with bus.queue("seq") as queue:
        first = await queue.push(b"a", producer="etl", sequence=1)
        assert await queue.push(b"a again", producer="etl", sequence=1) == first
        batch = await queue.push_batch([b"b", b"c"], producer="etl", sequence=2)
        assert await queue.push_batch([b"b", b"c"], producer="etl", sequence=2) == batch
        result = await queue.push_encoded([], producer="etl", sequence=2)
        assert result.ids == [] and not result.duplicate  # nothing to push: no call
        assert await queue.count() == 3
        assert queue.pushed == 3
        async with queue.consume(Mode.AT_MOST_ONCE, max=3) as consumer:
            assert [d.data async for d in consumer] == [b"a", b"b", b"c"]


async def test_an_older_sequence_is_a_duplicate_whose_ids_are_no_longer_known(bus: Bus) -> None:
    async with bus.queue("older") as queue:
        await queue.push(b"1", producer="etl", sequence=1)
        await queue.push(b"5", producer="etl", sequence=5)  # gaps are allowed
        assert await queue.push(b"1", producer="etl", sequence=1) == 0
        assert await queue.push_batch([b"3"], producer="etl", sequence=3) == []
        again = await queue.push_encoded(
            [_encoded(b"4")], producer="etl", sequence=4, request_id="never-seen"
        )
        assert again.duplicate and again.ids == []
        assert await queue.count() == 2


async def test_producers_and_queues_are_numbered_apart(bus: Bus) -> None:
    async with bus.queue("left") as left, bus.queue("right") as right:
        assert await left.push(b"x", producer="one", sequence=7) == 1
        assert await left.push(b"y", producer="two", sequence=7) == 2
        assert await right.push(b"z", producer="one", sequence=7) == 1
        assert await left.count() == 2 and await right.count() == 1


async def test_sequences_outlive_the_request_id_window(bus: Bus, shard_urls: list[str]) -> None:
    """A request id is remembered for ``dedupe_seconds`` (its key expires); a producer's
    sequence is kept in the queue itself. Deleting the request id's key stands for its
    window running out."""
    async with bus.queue("window") as queue:
        await queue.push(b"m", request_id="r-1", producer="etl", sequence=1)
        dedupe_key = QueueKeys("window").dedupe_prefix + "r-1"
        deleted = 0
        for url in shard_urls:
            client = aioredis.from_url(url)
            try:
                deleted += await client.delete(dedupe_key)
            finally:
                await client.aclose()
        assert deleted == 1
        assert await queue.push(b"m", request_id="r-1", producer="etl", sequence=1) == 1
        assert await queue.push(b"m", request_id="r-1") == 2  # the window has passed
        assert await queue.count() == 2


async def test_a_newer_producer_instance_fences_the_older_one(bus: Bus) -> None:
    old = await bus.producer("ingest")
    new = await bus.producer("ingest")
    assert new.name == old.name == "ingest" and new.epoch > old.epoch
    async with bus.queue("fenced") as queue:
        await queue.push(b"old 1", producer=old, sequence=10)
        # The new instance starts its own numbering: a higher epoch resets the sequence.
        await queue.push(b"new 1", producer=new, sequence=0)
        with pytest.raises(ProducerFencedError) as refused:
            await queue.push(b"old 2", producer=old, sequence=11)
        assert refused.value.queue == "fenced"
        assert refused.value.producer == "ingest"
        assert (refused.value.epoch, refused.value.current_epoch) == (old.epoch, new.epoch)
        assert await queue.push(b"new 2", producer=new, sequence=1) == 3
        async with queue.consume(Mode.AT_MOST_ONCE, max=3) as consumer:
            assert [d.data async for d in consumer] == [b"old 1", b"new 1", b"new 2"]
    # Another queue has not seen the new instance yet: the old one still pushes there.
    async with bus.queue("elsewhere") as queue:
        assert await queue.push(b"x", producer=old, sequence=12) == 1


async def test_epochs_keep_growing_across_bus_instances(
    shard_urls: list[str], make_bus: Callable[..., Any]
) -> None:
    first = await make_bus(shard_urls)
    epoch = (await first.producer("job")).epoch
    await first.close()
    second = await make_bus(shard_urls)
    assert (await second.producer("job")).epoch == epoch + 1
    assert (await second.producer("other")).epoch == 1


async def test_bad_producer_arguments_are_refused(bus: Bus) -> None:
    async with bus.queue("args") as queue:
        with pytest.raises(ValueError, match="go together"):
            await queue.push(b"x", producer="etl")
        with pytest.raises(ValueError, match="go together"):
            await queue.push(b"x", sequence=1)
        with pytest.raises(ValueError, match="sequence"):
            await queue.push(b"x", producer="etl", sequence=-1)
        with pytest.raises(ValueError, match="sequence"):
            await queue.push(b"x", producer="etl", sequence=2**53)
        with pytest.raises(InvalidNameError):
            await queue.push(b"x", producer="has space", sequence=1)
        with pytest.raises(ValueError, match="epoch"):
            Producer("etl", -1)
        assert await queue.count() == 0


def _encoded(payload: bytes) -> EncodedMessage:
    return encode(payload, None, 1024)
