"""``busmq demo``: a producer and an at-least-once consumer on the bus.

With no ``--redis-url`` or ``BUSMQ_REDIS_URLS``, it uses the embedded Redis of
``BUSMQ_DATA_DIR`` (default ``~/.local/share/busmq/redis``): the one a gateway or an
application already runs there, else its own.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from ..bus import Bus
from ..consuming import Mode
from ..queue import Queue
from ..settings import BusSettings


async def _produce(queue: Queue, rate: float, count: int | None) -> None:
    sent = 0
    while count is None or sent < count:
        message_id = await queue.push({"n": sent, "sent_at": time.time()}, headers={"demo": "1"})
        logging.info("pushed   #%d", message_id)
        sent += 1
        await asyncio.sleep(1 / rate)


async def _consume(queue: Queue, count: int | None) -> None:
    async with queue.consume(Mode.AT_LEAST_ONCE, max=count) as consumer:
        async for delivery in consumer:
            lag_ms = (time.time() - delivery.data["sent_at"]) * 1000
            logging.info("consumed #%d %s (%.1f ms)", delivery.id, delivery.data, lag_ms)
            await delivery.ack()


async def demo(settings: BusSettings, queue_name: str, rate: float, count: int | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Bus(settings) as bus:
        where = bus.embedded.url if bus.embedded else ", ".join(s.label for s in bus.shards)
        logging.info("bus online on %s", where)
        async with bus.queue(queue_name) as queue:
            tasks = [
                asyncio.create_task(_produce(queue, rate, count)),
                asyncio.create_task(_consume(queue, count)),
            ]
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait([tasks[1], stopper], return_when=asyncio.FIRST_COMPLETED)
            for task in (*tasks, stopper):
                task.cancel()
            await asyncio.gather(*tasks, stopper, return_exceptions=True)
            logging.info("pushed %d, consumed %d", queue.pushed, queue.consumed)
