"""A channel peer in its own process, for tests/core/test_channel.py.

``python -m tests.support.channel_peer <urls-json> <channel> <behaviour>``; it listens
(plays the ``remote`` role) and prints JSON lines:

- ``echo``: prints every message and event; answers each message ``m`` with
  ``{"echo": m}``; on the message ``"bye"`` disconnects and exits.
- ``until-ended``: prints events; exits once the channel has ended.
- ``slow-sink``: at-least-once (visibility timeout 1 s); prints ``{"got": n}`` for
  each message ``{"n": n}`` before acking it, a few ms apart; runs until killed.
"""

from __future__ import annotations

import asyncio
import json
import sys

from busmq import Bus, Mode
from busmq.channel import Channel
from busmq.events import Event
from tests.support.processes import emit, helper_settings


def report(event: Event) -> None:
    if event.kind != "message":
        emit(event=event.kind, **{k: v for k, v in event.details.items() if k != "delivery"})


async def echo(channel: Channel) -> None:
    await channel.listen()
    async for delivery in channel:
        emit(message=delivery.data)
        if delivery.data == "bye":
            await channel.disconnect()
            return
        await channel.send({"echo": delivery.data})


async def until_ended(channel: Channel) -> None:
    ended = asyncio.Event()
    channel.events.on(lambda event: ended.set() if event.kind == "ended" else None)
    await channel.listen()
    await ended.wait()


async def slow_sink(channel: Channel) -> None:
    await channel.listen(Mode.AT_LEAST_ONCE, prefetch=5, visibility_timeout=1.0)
    async for delivery in channel:
        emit(got=delivery.data["n"], redelivered=delivery.redelivered)
        await asyncio.sleep(0.003)  # a slow sink's handling time
        await delivery.ack()


async def main() -> None:
    urls, name, behaviour = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    async with Bus(helper_settings(urls)) as bus:
        channel = Channel(bus, name)
        channel.events.on(report)
        run = {"echo": echo, "until-ended": until_ended, "slow-sink": slow_sink}[behaviour]
        await run(channel)
        emit(event="done")


if __name__ == "__main__":
    asyncio.run(main())
