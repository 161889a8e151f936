"""Schemas per queue: what checking costs, in one run.

1. **Validators**: microseconds per message to parse and validate ``--messages`` JSON
   orders (10 fields: types, required, an enum, a pattern, a nested object; one in ten
   invalid) with jsonschema-rs (what busmq uses), fastjsonschema and jsonschema.
2. **Flood**: at-most-once, one producer pushing batches of ``--batch`` such orders (as
   dicts, so JSON-encoded by the push: a check then validates the values it was given) and
   ``--consumers`` consumers, on a queue with that schema and on one without, rounds
   interleaved (medians): msg/s and the ratio (``core_bench.py --modes schema`` runs this).
3. **Through a gateway** (``--gateway``): the same flood through a ``busmq-gateway``
   process of its own, the orders pushed as JSON payloads with unary ``Push`` calls by
   four producers and read over an at-most-once ``Consume`` stream; the gateway checks
   each push against the queue's schema.

Usage::

    .venv/bin/python bench/schema_bench.py
    .venv/bin/python bench/schema_bench.py --seconds 3 --rounds 1
    .venv/bin/python bench/schema_bench.py --gateway
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from _redis import local_redis  # bench/ is sys.path[0]
from busmq import Bus, BusSettings, Mode

ORDER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^o-[0-9]+$"},
        "customer": {"type": "string", "minLength": 1},
        "qty": {"type": "integer", "minimum": 1},
        "price": {"type": "number", "minimum": 0},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "state": {"enum": ["new", "paid", "sent"]},
        "gift": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 200},
        "created": {"type": "integer"},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["zip"],
        },
    },
    "required": ["id", "customer", "qty", "price", "currency", "state"],
}


def orders(n: int, invalid_every: int = 0) -> list[bytes]:
    rng = random.Random(40)
    made = []
    for i in range(n):
        order: dict[str, Any] = {
            "id": f"o-{i}",
            "customer": f"c{rng.randrange(1000)}",
            "qty": rng.randrange(1, 10),
            "price": round(rng.random() * 100, 2),
            "currency": rng.choice(["EUR", "USD", "GBP"]),
            "state": rng.choice(["new", "paid", "sent"]),
            "gift": rng.random() < 0.1,
            "note": "leave at the door",
            "created": 1_764_300_000_000 + i,
            "address": {"street": "1 Main St", "zip": f"{rng.randrange(10000):05d}"},
        }
        if invalid_every and i % invalid_every == 0:
            order["qty"] = "7"
        made.append(json.dumps(order).encode())
    return made


def validators() -> dict[str, Callable[[Any], bool]]:
    """Each library's ``is valid`` for ORDER (those installed)."""
    import jsonschema_rs

    found: dict[str, Callable[[Any], bool]] = {
        "jsonschema-rs": jsonschema_rs.validator_for(ORDER).is_valid
    }
    try:
        import fastjsonschema

        compiled = fastjsonschema.compile(ORDER)

        def fast(instance: Any) -> bool:
            try:
                compiled(instance)
            except fastjsonschema.JsonSchemaException:
                return False
            return True

        found["fastjsonschema"] = fast
    except ImportError:
        pass
    try:
        import jsonschema

        found["jsonschema"] = jsonschema.Draft202012Validator(ORDER).is_valid
    except ImportError:
        pass
    return found


def validator_figures(messages: int) -> list[str]:
    payloads = orders(messages, invalid_every=10)
    lines = [f"validators: parse + validate, {messages:,} orders (1 in 10 invalid), us/msg"]
    start = time.perf_counter()
    for payload in payloads:
        json.loads(payload)
    parse = (time.perf_counter() - start) / messages * 1e6
    lines.append(f"  json.loads alone {parse:6.2f}")
    for name, is_valid in validators().items():
        start = time.perf_counter()
        valid = sum(is_valid(json.loads(p)) for p in payloads)
        per = (time.perf_counter() - start) / messages * 1e6
        lines.append(f"  {name:<16} {per:6.2f}   ({valid:,} valid)")
    try:
        import orjson  # busmq parses payloads with it
    except ImportError:
        return lines
    start = time.perf_counter()
    for payload in payloads:
        orjson.loads(payload)
    parse = (time.perf_counter() - start) / messages * 1e6
    lines.append(f"  orjson.loads alone {parse:4.2f}")
    is_valid = validators()["jsonschema-rs"]
    start = time.perf_counter()
    valid = sum(is_valid(orjson.loads(p)) for p in payloads)
    per = (time.perf_counter() - start) / messages * 1e6
    lines.append(f"  orjson + jsonschema-rs {per:4.2f}   ({valid:,} valid): what busmq does")
    return lines


async def flood(bus: Bus, args: argparse.Namespace, checked: bool, tag: str) -> float:
    queue = bus.queue(f"schema-{int(checked)}-{tag}")
    await queue.attach()
    if checked:
        from busmq import JsonSchema  # here: bench/ab.py runs this file on older trees too

        await queue.set_schema(JsonSchema(ORDER))
    batch = [json.loads(order) for order in orders(args.batch)]  # pushed as values
    consumed = 0

    async def produce() -> None:
        while True:
            if consumed + 20_000 < pushed[0]:
                await asyncio.sleep(0.001)  # a bounded backlog
                continue
            await queue.push_batch(batch)
            pushed[0] += len(batch)

    async def consume() -> None:
        nonlocal consumed
        async with queue.consume(Mode.AT_MOST_ONCE, prefetch=args.batch) as consumer:
            while True:
                consumed += len(await consumer.next_batch())

    pushed = [0]
    rate = await consumed_per_second(
        [produce()], [consume() for _ in range(args.consumers)], lambda: consumed, args
    )
    await queue.close()
    return rate


async def consumed_per_second(
    producers: list[Coroutine[Any, Any, None]],
    consumers: list[Coroutine[Any, Any, None]],
    consumed: Callable[[], int],
    args: argparse.Namespace,
) -> float:
    """Run the producers and consumers; after ``--warmup`` s, what ``consumed()`` grew
    by per second over ``--seconds`` s."""
    tasks = [asyncio.create_task(c) for c in producers + consumers]
    await asyncio.sleep(args.warmup)
    start, before = time.perf_counter(), consumed()
    await asyncio.sleep(args.seconds)
    rate = (consumed() - before) / (time.perf_counter() - start)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return rate


async def gateway_flood(
    stub: Any, bus: Bus, args: argparse.Namespace, checked: bool, tag: str
) -> float:
    """The flood above through the gateway ``stub`` calls; the queue made and its schema
    set on ``bus`` (the gateway's Redis)."""
    from busmq.v1 import queue_service_pb2 as pb  # here: ab.py runs older trees
    from busmq.v1 import types_pb2

    name = f"gw-schema-{int(checked)}-{tag}"
    queue = bus.queue(name)
    await queue.attach()
    if checked:
        from busmq import JsonSchema

        await queue.set_schema(JsonSchema(ORDER))
    json_kind = types_pb2.PAYLOAD_KIND_JSON
    request = pb.PushRequest(
        queue=name,
        messages=[types_pb2.OutgoingMessage(payload=o, kind=json_kind) for o in orders(args.batch)],
    )
    consumed = 0
    pushed = [0]

    async def produce() -> None:
        while True:
            if consumed + 20_000 < pushed[0]:
                await asyncio.sleep(0.001)  # a bounded backlog
                continue
            pushed[0] += args.batch
            await stub.Push(request, metadata=GATEWAY_AUTH)

    async def consume() -> None:
        nonlocal consumed
        call = stub.Consume(
            pb.ConsumeRequest(
                queue=name,
                mode=types_pb2.CONSUME_MODE_AT_MOST_ONCE,
                prefetch=args.batch,
                batch=True,
            ),
            metadata=GATEWAY_AUTH,
        )
        async for response in call:
            consumed += len(response.batch.deliveries) + response.HasField("delivery")

    rate = await consumed_per_second(
        [produce() for _ in range(4)],
        [consume() for _ in range(args.consumers)],
        lambda: consumed,
        args,
    )
    await queue.close()
    return rate


GATEWAY_SECRET = "bench-secret-0123456789"
GATEWAY_AUTH = (("authorization", f"Bearer {GATEWAY_SECRET}"),)


async def run_gateway(url: str, args: argparse.Namespace) -> str:
    import grpc

    from busmq.v1 import queue_service_pb2_grpc
    from gateway_bench import start_gateway

    process, target = await start_gateway(url)
    rates: dict[bool, list[float]] = {False: [], True: []}
    try:
        async with (
            Bus(BusSettings(redis_urls=(url,))) as bus,
            grpc.aio.insecure_channel(target) as channel,
        ):
            stub = queue_service_pb2_grpc.QueueServiceStub(channel)
            for round_ in range(args.rounds):
                for checked in (False, True):
                    rate = await gateway_flood(stub, bus, args, checked, str(round_))
                    rates[checked].append(rate)
    finally:
        process.terminate()
        await process.wait()
    plain, checked = (statistics.median(rates[c]) for c in (False, True))
    return (
        f"through a gateway (unary Push of {args.batch} JSON orders, 4 producers, "
        f"{args.consumers} Consume stream(s)), medians of {args.rounds}: no schema "
        f"{plain:,.0f} msg/s, with the schema {checked:,.0f} msg/s, {checked / plain:.2f}x"
    )


async def run(url: str, args: argparse.Namespace) -> str:
    rates: dict[bool, list[float]] = {False: [], True: []}
    async with Bus(BusSettings(redis_urls=(url,))) as bus:
        for round_ in range(args.rounds):
            for checked in (False, True):
                rates[checked].append(await flood(bus, args, checked, str(round_)))
    plain, checked = (statistics.median(rates[c]) for c in (False, True))
    lines = validator_figures(args.messages)
    lines.append(
        f"at-most-once flood, 10-field JSON orders, batches of {args.batch}, "
        f"{args.consumers} consumer(s), medians of {args.rounds}: no schema {plain:,.0f} "
        f"msg/s, with the schema {checked:,.0f} msg/s, {checked / plain:.2f}x"
    )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """The options of this bench (``prefix`` names them where another script embeds it)."""
    dest = prefix.replace("-", "_")
    p.add_argument(f"--{prefix}messages", dest=f"{dest}messages", type=int, default=20_000)
    p.add_argument(f"--{prefix}consumers", dest=f"{dest}consumers", type=int, default=1)
    p.add_argument(f"--{prefix}rounds", dest=f"{dest}rounds", type=int, default=3)


async def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--gateway", action="store_true", help="also through a gateway")
    add_arguments(p)
    args = p.parse_args(argv)
    with local_redis() as server:
        print(await run(server.url, args))
        if args.gateway:
            print(await run_gateway(server.url, args))


if __name__ == "__main__":
    asyncio.run(main())
