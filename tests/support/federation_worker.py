"""The B side of a federation in its own process, for the outbox test (killed with SIGKILL).

python -m tests.support.federation_worker push REDIS_URL TARGET OUTBOX QUEUE
        --secret S --count N --batch B
    Federate QUEUE behind TARGET, push messages ``"0"`` .. ``"N-1"`` in batches of B,
    print ``{"event": "pushed", "ids": [...] | null}`` per batch, then
    ``{"event": "done", "outbox_depth": D}``, and wait to be killed.

python -m tests.support.federation_worker drain REDIS_URL TARGET OUTBOX QUEUE --secret S
    Open the same outbox, print ``{"event": "started", "outbox_depth": D}``, wait until
    the outbox is empty, print ``{"event": "drained", "forwarded": F}`` and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from busmq import Bus
from busmq.federation import FederationSettings, FederationTarget
from tests.support.processes import emit, helper_settings
from tests.support.waiting import eventually

FAST_LINK = {
    "reconnect_backoff_initial": 0.05,
    "reconnect_backoff_max": 0.5,
    "connect_timeout": 1.0,
    "operation_timeout": 3.0,
}


async def run(args: argparse.Namespace) -> None:
    async with Bus(helper_settings([args.redis_url])) as bus:
        manager = bus.configure_federation(
            FederationSettings(
                targets=[FederationTarget(args.target, secret=args.secret)],
                outbox_path=Path(args.outbox),
                **FAST_LINK,  # type: ignore[arg-type]
            )
        )
        queue = bus.federate(args.queue, args.target)
        outbox = await manager.ready_outbox()
        if args.command == "push":
            for start in range(0, args.count, args.batch):
                end = min(start + args.batch, args.count)
                ids = await queue.push_batch([str(i) for i in range(start, end)])
                emit(event="pushed", ids=ids)
            emit(event="done", outbox_depth=outbox.depth())
            await asyncio.Event().wait()  # until SIGKILL
        emit(event="started", outbox_depth=outbox.depth())
        await eventually(lambda: outbox.depth() == 0, timeout=60, what="outbox drained")
        emit(event="drained", forwarded=manager.forwarders[queue.target].forwarded)


def main() -> None:
    parser = argparse.ArgumentParser(prog="federation_worker")
    parser.add_argument("command", choices=["push", "drain"])
    parser.add_argument("redis_url")
    parser.add_argument("target")
    parser.add_argument("outbox")
    parser.add_argument("queue")
    parser.add_argument("--secret", required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--batch", type=int, default=100)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
