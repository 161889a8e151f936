"""The TypeScript and Go clients' consumers across a Sentinel failover behind the gateway:
a Node or Go process consumes at-least-once as the client's README writes it (an error
ends it), while pushes with request ids go on and the master is SIGKILLed. The loop never
ends, and every acknowledged push reaches it."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from busmq import Bus, Durability
from tests.support.gateway_process import GatewayProcess
from tests.support.heavy import cpu_heavy
from tests.support.loops import Ledger, produce
from tests.support.sentinel import SentinelGroup
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
    pytest.mark.usefixtures("collect_sentinel_leaks"),
]

ROOT = Path(__file__).resolve().parents[2]
TYPESCRIPT = ROOT / "clients" / "typescript"
GO = ROOT / "clients" / "go"
SECRET = "client-failover-secret-0123456789"
TOTAL = 1_500
MakeBus = Callable[..., Awaitable[Bus]]

CONSUMER = """
import { BusClient } from "%(client)s";
const client = new BusClient({ url: process.env.BUSMQ_URL, secret: process.env.BUSMQ_SECRET });
const orders = client.queue("orders");
await orders.attach();
for await (const delivery of orders.consume({ mode: "at-least-once", prefetch: 50 })) {
  process.stdout.write(`${delivery.id} ${delivery.data.n}\\n`);
  await delivery.ack();
}
process.stdout.write("ended\\n");
"""


GO_CONSUMER = """package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"

	busmq "busmq.dev/go"
	pb "busmq.dev/go/gen/busmq/v1"
)

func main() {
	ctx := context.Background()
	options := busmq.Options{Address: os.Getenv("BUSMQ_ADDRESS"), Secret: os.Getenv("BUSMQ_SECRET")}
	client, err := busmq.Dial(ctx, options)
	if err != nil {
		log.Fatal(err)
	}
	orders := client.Queue("orders")
	if _, err := orders.Attach(ctx, 0); err != nil {
		log.Fatal(err)
	}
	mode := pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE
	consumer := orders.Consume(ctx, busmq.ConsumeOptions{Mode: mode, Prefetch: 50})
	for delivery := range consumer.Deliveries() {
		var message struct{ N int `json:"n"` }
		if err := json.Unmarshal(delivery.Payload, &message); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d %d\\n", delivery.ID, message.N)
		if err := delivery.Ack(ctx); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("ended", consumer.Err())
}
"""


def typescript_consumer(directory: Path) -> list[str]:
    """The client compiled (``npm test`` builds it too; a pytest run alone may not have)
    and the README's loop as a script."""
    subprocess.run([str(TYPESCRIPT / "node_modules" / ".bin" / "tsc"), "-p", "."],
                   cwd=TYPESCRIPT, check=True)  # fmt: skip
    script = directory / "consume.mjs"
    script.write_text(CONSUMER % {"client": (TYPESCRIPT / "dist" / "src" / "index.js").as_uri()})
    return ["node", str(script)]


def go_consumer(directory: Path) -> list[str]:
    """The loop built against the client as clients/go/test.sh builds it (GOPATH mode,
    Debian's Go packages: no module proxy)."""
    gopath = directory / "gopath"
    (gopath / "src" / "busmq.dev").mkdir(parents=True)
    (gopath / "src" / "busmq.dev" / "go").symlink_to(GO)
    (gopath / "src" / "consume").mkdir()
    (gopath / "src" / "consume" / "main.go").write_text(GO_CONSUMER)
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": f"{gopath}:/usr/share/gocode",
           "GOFLAGS": "", "GOCACHE": str(directory / "gocache")}  # fmt: skip
    binary = directory / "consume"
    subprocess.run(["go", "build", "-o", str(binary), "consume"], cwd=gopath, env=env, check=True)
    return [str(binary)]


@cpu_heavy
@pytest.mark.parametrize("client", ["typescript", "go"])
async def test_a_client_consumer_rides_through_a_sentinel_failover(
    sentinel_group: SentinelGroup, make_bus: MakeBus, tmp_path: Path, client: str
) -> None:
    build = typescript_consumer if client == "typescript" else go_consumer
    argv = await asyncio.to_thread(build, tmp_path)
    gateway = GatewayProcess(sentinel_group.url, (SECRET,), env={"BUSMQ_DURABILITY": "replicas=1"})
    await gateway.start()
    address = {"BUSMQ_URL": f"http://{gateway.target}", "BUSMQ_ADDRESS": gateway.target}
    consumer = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **address, "BUSMQ_SECRET": SECRET},
    )  # fmt: skip
    delivered: dict[int, set[int]] = defaultdict(set)
    lines: list[str] = []

    async def read() -> None:
        assert consumer.stdout is not None
        async for raw in consumer.stdout:
            line = raw.decode().strip()
            lines.append(line)  # a delivery "id n", or what ended the loop
            fields = line.split()
            if len(fields) == 2 and all(f.isdigit() for f in fields):
                delivered[int(fields[1])].add(int(fields[0]))

    reader = asyncio.create_task(read())
    bus: Bus = await make_bus([sentinel_group.url], durability=Durability(replicas=1))
    ledger = Ledger()
    try:
        async with bus.queue("orders"):
            producer = asyncio.create_task(produce(bus, "orders", ledger, range(TOTAL)))

            def under_way() -> bool:
                assert consumer.returncode is None, f"the {client} consumer ended: {lines[-5:]}"
                return len(delivered) >= TOTAL // 3

            await eventually(under_way, timeout=60, what=f"the {client} consumer under way")
            await sentinel_group.kill_master()
            await asyncio.wait_for(producer, 120)

            def all_consumed() -> bool:
                assert consumer.returncode is None, f"the {client} consumer ended: {lines[-5:]}"
                return all(i in delivered.get(n, ()) for n, i in ledger.acknowledged.items())

            await eventually(all_consumed, timeout=60, what="every acknowledged push consumed")
            assert consumer.returncode is None, lines[-5:]
    finally:
        if consumer.returncode is None:
            consumer.terminate()
        await consumer.wait()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await gateway.stop()
    assert len(ledger.acknowledged) == TOTAL
    redelivered = sum(len(ids) for ids in delivered.values()) - len(delivered)
    print(f"\n{client} consumer across a failover: {TOTAL} acknowledged, all consumed; "
          f"{len(ledger.push_errors)} push errors retried; {redelivered} stored twice")  # fmt: skip
