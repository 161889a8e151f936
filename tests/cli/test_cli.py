"""The ``busmq`` command line, run as a process against real redis-servers (and once
through a gateway): every command, its JSON output and its exit codes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from busmq import Bus, JsonSchema, Mode
from tests.support.cli import busmq
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer


async def test_queues_lists_every_shard_with_figures(
    shard_urls: list[str], make_bus: Callable[..., Any]
) -> None:
    bus: Bus = await make_bus(shard_urls)
    for n in range(7):
        queue = bus.queue(f"q{n}")
        await queue.attach(ttl=120)
        await queue.push_batch(list(range(n)))
    work = bus.queue("work")
    await work.attach(ttl=120)
    await work.push_batch(["a", "b", "c"])
    await work.set_max_deliveries(1)
    async with work.consume(Mode.AT_LEAST_ONCE, max=2) as consumer:
        first = await consumer.__anext__()
        await first.reject("bad")
        await consumer.__anext__()  # delivered, never acked
    await work.pause()

    listed = await busmq("--json", "queues", urls=shard_urls)
    assert listed.code == 0, listed.err
    rows = {row["name"]: row for row in listed.json()}
    assert sorted(rows) == ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "work"]  # no work:dead
    assert [rows[f"q{n}"]["depth"] for n in range(7)] == list(range(7))
    assert {rows[f"q{n}"]["last_id"] for n in range(7)} == set(range(7))
    work_row = rows["work"]
    assert (work_row["depth"], work_row["pending"], work_row["dead_letters"]) == (1, 1, 1)
    assert rows["work"]["consumers"] == 1 and rows["work"]["paused"] is True
    assert rows["work"]["mode"] == "destructive"
    assert 100 < rows["work"]["ttl"] <= 120 + 3  # while attached: ttl after the lease
    everything = await busmq("--json", "queues", "--all", "--prefix", "work", urls=shard_urls)
    assert [row["name"] for row in everything.json()] == ["work", "work:dead"]

    table = await busmq("queues", urls=shard_urls)
    assert table.code == 0
    assert "8 queue(s)" in table.out and "paused" in table.out and "work" in table.out

    inspected = await busmq("--json", "inspect", "work", urls=shard_urls)
    fields = inspected.json()
    assert (fields["name"], fields["max_deliveries"], fields["paused"]) == ("work", 1, True)
    assert fields["dead_letters"] == 1 and fields["metadata"] == {}


async def ordered_with_one_waiting(bus: Bus, name: str) -> None:
    """Queue ``name`` ordered per header ``k``: one message holds key c1, one waits."""
    queue = bus.queue(name)
    await queue.attach(ttl=120)
    await queue.set_ordering("k")
    await queue.push_batch([("e", {"k": "c1"}), ("f", {"k": "c1"})])
    async with queue.consume(Mode.AT_LEAST_ONCE, max=2) as consumer:
        await consumer.__anext__()  # one read of both: e takes c1 (given back, still holds it)


async def test_queues_and_inspect_show_the_ordering_per_key(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    urls = [redis_server.url]
    await ordered_with_one_waiting(await make_bus(urls), "ledger")
    inspected = (await busmq("--json", "inspect", "ledger", urls=urls)).json()
    assert (inspected["ordering"], inspected["ordered_keys_in_flight"]) == ("k", 1)
    assert inspected["ordered_waiting"] == 1 and inspected["oldest_ordered_wait_seconds"] >= 0
    table = await busmq("inspect", "ledger", urls=urls)
    for row in ("ordered by", "keys with a delivery in flight", "messages waiting for their key"):
        assert row in table.out
    assert "oldest waiting" in table.out
    listed = await busmq("queues", urls=urls)
    assert "ordered by k (1 keys in flight, 1 waiting)" in listed.out


async def test_push_tail_and_follow(redis_server: RedisServer) -> None:
    urls = [redis_server.url]
    pushed = await busmq("--json", "push", "log", "--ttl", "60", "-H", "src=cli",
                         stdin=b"one\ntwo\n\nthree\n", urls=urls)  # fmt: skip
    assert pushed.code == 0, pushed.err
    assert pushed.json() == {"pushed": 3, "queue": "log", "first_id": 1, "last_id": 3}
    as_json = await busmq("--json", "push", "log", "--kind", "json", stdin=b'{"n": 4}\n', urls=urls)
    assert as_json.json()["first_id"] == 4

    tail = await busmq("--json", "tail", "log", "-n", "2", urls=urls)
    assert [(r["id"], r["payload"]) for r in tail.lines()] == [(3, "three"), (4, '{"n": 4}')]
    everything = await busmq("--json", "tail", "log", "--from-id", "0", urls=urls)
    records = everything.lines()
    assert [r["payload"] for r in records] == ["one", "two", "three", '{"n": 4}']
    assert records[0]["headers"] == {"src": "cli"} and records[3]["kind"] == "json"
    # Tailing consumed nothing.
    again = await busmq("--json", "tail", "log", "--from-id", "0", urls=urls)
    assert again.lines() == records
    text = await busmq("tail", "log", "-n", "1", urls=urls)
    assert text.out == '#4 {"n": 4}\n'

    env = {**os.environ, "BUSMQ_REDIS_URLS": redis_server.url}
    follower = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "busmq", "--json", "tail", "log", "-n", "1", "--follow",
        stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        assert follower.stdout is not None
        first = json.loads(await asyncio.wait_for(follower.stdout.readline(), 20))
        assert first["id"] == 4
        await busmq("push", "log", stdin=b"five\n", urls=urls)
        new = json.loads(await asyncio.wait_for(follower.stdout.readline(), 20))
        assert (new["id"], new["payload"]) == (5, "five")
    finally:
        follower.terminate()
        await follower.wait()


async def test_export_then_import_into_another_redis_is_identical(
    redis_server: RedisServer, make_bus: Callable[..., Any], tmp_path: Path
) -> None:
    bus: Bus = await make_bus([redis_server.url])
    source = bus.queue("orders")
    await source.attach(ttl=120)
    values: list[Any] = ["text é", b"\x00\xffbytes", {"n": 1, "nested": [1, 2]}, 3.5, None]
    for n, value in enumerate(values * 300):
        await source.push(value, headers={"n": str(n), "tenant": "a" if n % 2 else "b"})
    async with source.consume(Mode.AT_LEAST_ONCE, max=3) as consumer:
        async for delivery in consumer:
            await delivery.ack()  # removed: the export starts at 4
    export_file = tmp_path / "orders.jsonl"

    exported = await busmq("--json", "export", "orders", str(export_file), urls=[redis_server.url])
    assert exported.code == 0, exported.err
    assert exported.json()["exported"] == 1497
    records = [json.loads(line) for line in export_file.read_text().splitlines()]
    assert [r["id"] for r in records] == list(range(4, 1501))

    async with RedisServer(tmp_path / "other-redis") as other:
        imported = await busmq("--json", "import", str(export_file), "restored", "--ttl", "120",
                               urls=[other.url])  # fmt: skip
        assert imported.code == 0, imported.err
        assert imported.json() == {"imported": 1497, "queue": "restored", "first_id": 1,
                                   "last_id": 1497}  # fmt: skip
        target: Bus = await make_bus([other.url])
        originals = [m async for m in source.browse()]
        copies = [m async for m in target.queue("restored").browse()]
        assert [(m.payload, m.kind, dict(m.headers)) for m in copies] == [
            (m.payload, m.kind, dict(m.headers)) for m in originals
        ]
        assert [m.data for m in copies[:5]] == [values[3], values[4], *values[:3]]


async def test_import_refuses_a_bad_file_whole(redis_server: RedisServer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    good = '{"kind": "text", "payload": "ok", "headers": {}}\n'
    bad.write_text(good + '{"kind": "json", "payload": "{not json"}\n')
    result = await busmq("import", str(bad), "target", urls=[redis_server.url])
    assert result.code == 4
    assert "line 2" in result.err
    listed = await busmq("--json", "queues", urls=[redis_server.url])
    assert listed.json() == []  # nothing was pushed, not even line 1


async def test_copy_a_range_into_another_queue(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    bus: Bus = await make_bus([redis_server.url])
    queue = bus.queue("src")
    await queue.attach(ttl=120)
    await queue.push_batch([(f"m{n}", {"n": str(n)}) for n in range(1, 2001)])
    result = await busmq("--json", "copy", "src", "--from-id", "700", "--to-id", "1800",
                         "--into", "dst", "--ttl", "120", urls=[redis_server.url])  # fmt: skip
    assert result.code == 0, result.err
    assert result.json() == {"copied": 1101, "queue": "dst", "first_id": 1, "last_id": 1101}
    copied = [m async for m in bus.queue("dst").browse()]
    assert [m.data for m in copied] == [f"m{n}" for n in range(700, 1801)]
    assert copied[0].headers == {"n": "700"}
    assert await queue.count() == 2000  # the source is untouched

    itself = await busmq("copy", "src", "--into", "src", urls=[redis_server.url])
    assert itself.code == 2


async def test_dead_letters_ls_requeue_purge(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    urls = [redis_server.url]
    bus: Bus = await make_bus(urls)
    queue = bus.queue("jobs")
    await queue.attach(ttl=120)
    await queue.push_batch([f"job{n}" for n in range(5)])
    empty = await busmq("--json", "dead", "jobs", "ls", urls=urls)
    assert (empty.code, empty.out) == (0, "")
    async with queue.consume(Mode.AT_LEAST_ONCE, max=5) as consumer:
        async for delivery in consumer:
            await delivery.reject(f"bad {delivery.data}")

    listed = await busmq("--json", "dead", "jobs", "ls", urls=urls)
    letters = listed.lines()
    assert [r["payload"] for r in letters] == [f"job{n}" for n in range(5)]
    assert letters[0]["headers"]["busmq-dead-reason"] == "rejected"
    assert letters[0]["headers"]["busmq-dead-queue"] == "jobs"
    limited = await busmq("--json", "dead", "jobs", "ls", "--limit", "2", urls=urls)
    assert len(limited.lines()) == 2

    assert (await busmq("dead", "jobs", "requeue", urls=urls)).code == 2  # which ones?
    one = await busmq("--json", "dead", "jobs", "requeue", "--id", str(letters[1]["id"]), urls=urls)
    assert one.json() == {"requeued": 1, "ids": [6]}
    two = await busmq("--json", "dead", "jobs", "requeue", "--limit", "2", urls=urls)
    assert two.json()["requeued"] == 2
    assert [m.data for m in [m async for m in queue.browse()]] == ["job1", "job0", "job2"]

    refused = await busmq("dead", "jobs", "purge", urls=urls)
    assert refused.code == 2 and "--yes" in refused.err
    purged = await busmq("--json", "dead", "jobs", "purge", "--yes", urls=urls)
    assert purged.code == 0
    assert (await queue.info()).dead_letters == 0


async def test_exit_codes(redis_server: RedisServer) -> None:
    urls = [redis_server.url]
    assert (await busmq("inspect", "missing", urls=urls)).code == 3
    assert (await busmq("tail", "missing", urls=urls)).code == 3
    assert (await busmq("dead", "missing", "ls", urls=urls)).code == 3
    assert (await busmq("no-such-command", urls=urls)).code == 2
    assert (await busmq("push", "q", "--kind", "json", stdin=b"{oops\n", urls=urls)).code == 4
    down = await busmq("queues", urls=["redis://127.0.0.1:1"], timeout=60)
    assert down.code == 1 and "busmq:" in down.err


async def test_global_options_go_before_or_after_the_command(redis_server: RedisServer) -> None:
    await busmq("push", "placed", urls=[redis_server.url], stdin=b"one\n")
    before = await busmq("--json", "--redis-url", redis_server.url, "queues")
    after = await busmq("queues", "--json", "--redis-url", redis_server.url)
    mixed = await busmq("--redis-url", redis_server.url, "queues", "--json")
    assert before.code == after.code == mixed.code == 0, (before, after, mixed)
    listed = [json.loads(r.out) for r in (before, after, mixed)]
    assert [[q["name"] for q in each] for each in listed] == [["placed"]] * 3
    inspect = await busmq("inspect", "placed", "--redis-url", redis_server.url, "--json")
    assert json.loads(inspect.out)["messages"] == 1
    refused = await busmq("demo", "--gateway", "http://127.0.0.1:1")
    assert refused.code == 2 and "not --gateway" in refused.err


GATEWAY_SECRET = "cli-gateway-secret-0123456789"


@contextlib.asynccontextmanager
async def through_a_gateway(redis_url: str, tmp_path: Path) -> AsyncIterator[tuple[str, ...]]:
    """A gateway process on ``redis_url``: the ``busmq`` options that reach it."""
    secret_file = tmp_path / "secret"
    secret_file.write_text(GATEWAY_SECRET + "\n")
    secret_file.chmod(0o600)
    gateway = GatewayProcess(redis_url, (GATEWAY_SECRET,))
    await gateway.start()
    try:
        yield ("--gateway", f"http://{gateway.target}", "--secret-file", str(secret_file))
    finally:
        await gateway.stop()


async def test_commands_through_a_gateway(
    redis_server: RedisServer, tmp_path: Path, make_bus: Callable[..., Any]
) -> None:
    async with through_a_gateway(redis_server.url, tmp_path) as via:
        pushed = await busmq(*via, "--json", "push", "remote", "-H", "k=v", stdin=b"a\nb\nc\n")
        assert pushed.code == 0, pushed.err
        assert pushed.json()["last_id"] == 3
        listed = await busmq(*via, "--json", "queues")
        [row] = listed.json()
        assert (row["name"], row["depth"]) == ("remote", 3)
        tail = await busmq(*via, "--json", "tail", "remote", "--from-id", "2")
        assert [(r["id"], r["payload"], r["headers"]) for r in tail.lines()] == [
            (2, "b", {"k": "v"}),
            (3, "c", {"k": "v"}),
        ]
        export = tmp_path / "remote.jsonl"
        assert (await busmq(*via, "export", "remote", str(export))).code == 0
        assert (await busmq(*via, "import", str(export), "restored")).code == 0
        restored = await busmq(*via, "--json", "tail", "restored", "--from-id", "0")
        assert [r["payload"] for r in restored.lines()] == ["a", "b", "c"]
        inspected = await busmq(*via, "--json", "inspect", "remote")
        assert inspected.json()["last_id"] == 3
        assert (await busmq(*via, "inspect", "missing")).code == 3
        await ordered_with_one_waiting(await make_bus([redis_server.url]), "ledger")
        ledger = (await busmq(*via, "--json", "inspect", "ledger")).json()
        assert (ledger["ordering"], ledger["ordered_keys_in_flight"]) == ("k", 1)
        assert ledger["ordered_waiting"] == 1 and ledger["oldest_ordered_wait_seconds"] >= 0
        refused = await busmq("--gateway", via[1], "queues")
        assert refused.code == 1 and "credentials" in refused.err


async def test_through_a_tls_gateway_with_its_ca(redis_server: RedisServer, tmp_path: Path) -> None:
    from tests.support.certs import make_pki

    ca, server, _client = make_pki(tmp_path)
    secret = "cli-tls-secret-0123456789"
    (tmp_path / "secret").write_text(secret)
    (tmp_path / "secret").chmod(0o600)
    gateway = GatewayProcess(
        redis_server.url, (secret,), "--tls-cert", str(server.cert), "--tls-key", str(server.key)
    )
    await gateway.start()
    try:
        via = ("--gateway", f"https://{gateway.target}", "--secret-file", str(tmp_path / "secret"))
        pushed = await busmq(*via, "--ca-file", str(ca.cert), "--json", "push", "secure",
                             stdin=b"x\n")  # fmt: skip
        assert pushed.code == 0, pushed.err
        listed = await busmq(*via, "--ca-file", str(ca.cert), "--json", "queues")
        assert [q["name"] for q in listed.json()] == ["secure"]
        untrusted = await busmq(*via, "queues")  # the system roots do not know this CA
        assert untrusted.code == 1
    finally:
        await gateway.stop()


ORDER_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "qty": {"type": "integer"}},
    "required": ["id", "qty"],
}


async def schema_commands(*via: str, urls: Sequence[str] = ()) -> None:
    """``busmq schema`` set, get, versions, check and remove on queue ``ledger``."""
    document = json.dumps(ORDER_SCHEMA).encode()
    made = await busmq(*via, "--json", "schema", "ledger", "set", "-", stdin=document, urls=urls)
    assert made.code == 0, made.err
    assert made.json()["version"] == 1
    got = await busmq(*via, "schema", "ledger", "get", urls=urls)
    assert json.loads(got.out) == ORDER_SCHEMA
    wider = json.dumps({**ORDER_SCHEMA, "required": ["id", "qty", "sku"]}).encode()
    refused = await busmq(*via, "schema", "ledger", "set", stdin=wider, urls=urls)
    assert refused.code == 4 and "field `sku` became required" in refused.err
    lines = b'{"id": "a", "qty": 1}\n{"id": "b", "qty": "2"}\n'
    checked = await busmq(*via, "schema", "ledger", "check", stdin=lines, urls=urls)
    assert checked.code == 4, checked.err
    assert "line 2 at /qty" in checked.out and "(type)" in checked.out
    fits = await busmq(*via, "schema", "ledger", "check", stdin=lines[:22], urls=urls)
    assert fits.code == 0 and "1 message(s) fit schema version 1" in fits.err
    pushed = await busmq(*via, "push", "ledger", "--kind", "json", stdin=lines, urls=urls)
    assert pushed.code == 4 and "qty" in pushed.err  # the push is refused whole
    forced = await busmq(
        *via, "schema", "ledger", "set", "--compatibility", "NONE", stdin=wider, urls=urls
    )
    assert forced.code == 0, forced.err
    versions = (await busmq(*via, "--json", "schema", "ledger", "versions", urls=urls)).json()
    assert (versions["current_version"], versions["compatibility"]) == (2, "NONE")
    assert [v["version"] for v in versions["versions"]] == [1, 2]
    assert (await busmq(*via, "schema", "ledger", "remove", urls=urls)).code == 0
    assert "has no schema" in (await busmq(*via, "schema", "ledger", "get", urls=urls)).err


async def test_schema_commands(redis_server: RedisServer, make_bus: Callable[..., Any]) -> None:
    urls = [redis_server.url]
    await (await make_bus(urls)).queue("ledger").attach(ttl=120)
    await schema_commands(urls=urls)


async def test_import_into_a_queue_with_a_schema_is_refused_whole(
    redis_server: RedisServer, make_bus: Callable[..., Any], tmp_path: Path
) -> None:
    urls = [redis_server.url]
    bus: Bus = await make_bus(urls)
    source, target = bus.queue("exported"), bus.queue("checked")
    await source.attach(ttl=120)
    await source.push_batch([{"id": "a", "qty": 1}, {"id": "b"}])  # the second lacks qty
    await target.attach(ttl=120)
    await target.set_schema(JsonSchema(ORDER_SCHEMA))
    export = tmp_path / "exported.jsonl"
    assert (await busmq("export", "exported", str(export), urls=urls)).code == 0
    refused = await busmq("import", str(export), "checked", urls=urls)
    assert refused.code == 4 and "message 1 at /: " in refused.err and "qty" in refused.err
    assert [m async for m in target.browse()] == []  # nothing of it was stored
    await source.push({"id": "c", "qty": 2})
    fitting = tmp_path / "fitting.jsonl"
    assert (await busmq("export", "exported", str(fitting), "--from-id", "3", urls=urls)).code == 0
    assert (await busmq("import", str(fitting), "checked", urls=urls)).code == 0
    assert [(m.data, m.schema_version) async for m in target.browse()] == [
        ({"id": "c", "qty": 2}, 1)
    ]


async def test_schema_set_takes_a_protobuf_type(
    redis_server: RedisServer, tmp_path: Path, make_bus: Callable[..., Any]
) -> None:
    from tests.core.test_protobuf_schema import BASE

    urls = [redis_server.url]
    await (await make_bus(urls)).queue("typed").attach(ttl=120)
    descriptor = tmp_path / "order.binpb"
    descriptor.write_bytes(BASE)
    made = await busmq(
        "schema", "typed", "set", str(descriptor), "--protobuf", "shop.Order", urls=urls
    )
    assert made.code == 0, made.err
    got = await busmq("schema", "typed", "get", urls=urls)
    assert json.loads(got.out) == {"protobuf": "shop.Order", "allow_unknown": False}
    wrong = await busmq(
        "schema", "typed", "set", str(descriptor), "--protobuf", "shop.X", urls=urls
    )
    assert wrong.code == 4 and "no message 'shop.X'" in wrong.err


async def test_schema_commands_through_a_gateway(
    redis_server: RedisServer, tmp_path: Path, make_bus: Callable[..., Any]
) -> None:
    await (await make_bus([redis_server.url])).queue("ledger").attach(ttl=120)
    async with through_a_gateway(redis_server.url, tmp_path) as via:
        await schema_commands(*via)
