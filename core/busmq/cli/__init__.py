"""The ``busmq`` command line: look into and repair a bus, and run a demo.

    busmq queues                      every queue: depth, pending, consumers, mode, ttl
    busmq inspect Q                   one queue's figures, controls and metadata
    busmq tail Q [--from-id N] [-f]   stored messages, without consuming them
    busmq push Q [FILE]               one message per line of FILE or stdin
    busmq dead Q ls|requeue|purge     the queue's dead letters
    busmq copy Q --into Q2            replay a range of ids into another queue
    busmq export Q FILE               JSON lines with ids, headers and payloads
    busmq import FILE Q               push an export's messages, in order
    busmq schema Q get|versions|set|check|remove [FILE]   the queue's schema
    busmq federation status --metrics URL   links, outboxes and lag of running apps
    busmq demo                        a producer and a consumer on a demo queue

It works on the bus of ``--redis-url`` (repeatable) or ``BUSMQ_REDIS_URLS``, else on the
embedded Redis in ``BUSMQ_DATA_DIR``; or, with ``--gateway URL``, through a gateway
(``--secret-file``, ``--ca-file`` for https). ``--json`` prints JSON for scripts.

Exit codes: 0 done; 1 the bus or gateway failed; 2 bad usage; 3 no such queue;
4 bad input (a record or line that does not parse); 5 ``federation status
--fail-if-down`` found a link down; 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from ..errors import BusError, InvalidMessageError, QueueNotFoundError
from ..private import read_secret_file
from ..settings import BusSettings
from . import commands, federation, schema, transfer
from .admin import Admin, LocalAdmin, running_embedded
from .output import Output
from .records import RecordError

EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 2, 3, 4, 130

Command = Callable[[Admin, Output, argparse.Namespace], Awaitable[int]]


def _add_global_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("which bus")
    where.add_argument("--redis-url", action="append", help="a shard (repeatable)")
    where.add_argument("--gateway", metavar="URL", help="through a gateway: http(s)://host:port")
    where.add_argument("--secret-file", type=Path, help="the gateway's secret (or BUSMQ_SECRET)")
    where.add_argument("--ca-file", type=Path, help="CA certificate of an https gateway")
    parser.add_argument("--json", action="store_true", help="JSON output for scripts")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="busmq",
        description="Look into and repair a busmq bus.",
        epilog="See 'busmq COMMAND --help'. " + __doc__.split("Exit codes:")[1].strip(),
    )
    _add_global_options(parser)
    # The same options after the command (busmq queues --json): a command's parser
    # leaves out those not given, so it does not undo one given before the command.
    after = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    _add_global_options(after)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser = functools.partial(sub.add_parser, parents=[after])  # type: ignore[method-assign]

    queues = sub.add_parser("queues", help="list queues with their figures")
    queues.add_argument("--prefix", default="", help="only queues whose name starts with this")
    queues.add_argument("--all", action="store_true", help="also the <queue>:dead queues")

    inspect = sub.add_parser("inspect", help="one queue's figures, controls and metadata")
    inspect.add_argument("queue")

    tail = sub.add_parser("tail", help="print stored messages without consuming them")
    tail.add_argument("queue")
    tail.add_argument("--from-id", type=int, help="first id (default: the last --lines ids)")
    tail.add_argument("-n", "--lines", type=_positive, default=10, help="default 10")
    tail.add_argument("-f", "--follow", action="store_true", help="then wait for new ones")

    push = sub.add_parser("push", help="push one message per line of FILE (or stdin)")
    push.add_argument("queue")
    push.add_argument("file", nargs="?", type=argparse.FileType("r", encoding="utf-8"), default="-")
    push.add_argument("--kind", choices=("text", "json", "bytes"), default="text")
    push.add_argument("-H", "--header", action="append", default=[], metavar="NAME=VALUE")
    push.add_argument("--ttl", type=float, help="the queue's ttl if this creates it")

    dead = sub.add_parser("dead", help="list, requeue or purge a queue's dead letters")
    dead.add_argument("queue")
    dead.add_argument("action", choices=("ls", "requeue", "purge"))
    dead.add_argument("--id", type=int, action="append", help="requeue: this dead letter")
    dead.add_argument("--limit", type=int, default=0, help="ls/requeue: at most N, oldest first")
    dead.add_argument("--all", action="store_true", help="requeue: every dead letter")
    dead.add_argument("--yes", action="store_true", help="purge: yes, remove them all")

    copy = sub.add_parser("copy", help="push a range of a queue's messages into another")
    copy.add_argument("queue")
    copy.add_argument("--into", required=True, metavar="QUEUE")
    copy.add_argument("--from-id", type=int, default=0)
    copy.add_argument("--to-id", type=int, help="last id (default: the last stored)")
    copy.add_argument("--ttl", type=float, help="the target's ttl if this creates it")

    export = sub.add_parser("export", help="write a queue's messages as JSON lines")
    export.add_argument("queue")
    export.add_argument("file", help="- for stdout; a file is created readable by its owner only")
    export.add_argument("--from-id", type=int, default=0)
    export.add_argument("--to-id", type=int)

    imp = sub.add_parser("import", help="push the messages of an export, in order")
    imp.add_argument("file", type=argparse.FileType("r", encoding="utf-8"), help="- for stdin")
    imp.add_argument("queue")
    imp.add_argument("--ttl", type=float, help="the queue's ttl if this creates it")

    schema.add_parser(sub)

    fed = sub.add_parser("federation", help="federation links of running applications")
    fed_sub = fed.add_subparsers(dest="action", required=True, metavar="ACTION")
    fed_sub.add_parser = functools.partial(fed_sub.add_parser, parents=[after])  # type: ignore[method-assign]
    status = fed_sub.add_parser("status", help="links, outboxes and lag, from metrics endpoints")
    status.add_argument("--metrics", action="append", required=True, metavar="URL",
                        help="a /metrics URL of a process that federates (repeatable)")  # fmt: skip
    status.add_argument("--timeout", type=float, default=10.0)
    status.add_argument("--fail-if-down", action="store_true", help="exit 5 if a link is down")

    demo = sub.add_parser("demo", help="push and consume messages on a demo queue")
    demo.add_argument("--queue", default="demo")
    demo.add_argument("--rate", type=float, default=2.0, help="messages per second")
    demo.add_argument("--count", type=int, default=None, help="stop after N (default: run)")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


COMMANDS: dict[str, Command] = {
    "queues": commands.queues,
    "inspect": commands.inspect,
    "tail": commands.tail,
    "dead": commands.dead,
    "push": transfer.push,
    "copy": transfer.copy,
    "export": transfer.export,
    "import": transfer.import_,
    "schema": schema.schema,
}


def _secret(args: argparse.Namespace) -> str | None:
    if args.secret_file is not None:
        return read_secret_file(args.secret_file).strip()
    return os.environ.get("BUSMQ_SECRET") or None


def _settings(args: argparse.Namespace) -> BusSettings:
    """The bus of ``--redis-url``, else ``BUSMQ_REDIS_URLS``, else the embedded Redis of
    ``BUSMQ_DATA_DIR`` (the running one's socket when another process runs it)."""
    if args.redis_url:
        return BusSettings.from_env({**os.environ, "BUSMQ_REDIS_URLS": ",".join(args.redis_url)})
    return running_embedded(BusSettings.from_env())


async def _admin(args: argparse.Namespace) -> Admin:
    if args.gateway:
        from .remote import GatewayAdmin

        remote = GatewayAdmin(args.gateway, _secret(args), args.ca_file)
        try:
            await remote.connect()
        except BaseException:
            await remote.close()
            raise
        return remote
    local = LocalAdmin(_settings(args))
    try:
        await local.connect()
    except BaseException:
        await local.close()
        raise
    return local


async def _run(args: argparse.Namespace, out: Output) -> int:
    if args.command == "demo":
        from .demo import demo

        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True
        )
        await demo(_settings(args), args.queue, args.rate, args.count)
        return 0
    if args.command == "federation":
        return await federation.status(out, args, _secret(args))
    admin = await _admin(args)
    try:
        return await COMMANDS[args.command](admin, out, args)
    finally:
        await admin.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo" and args.gateway:
        parser.error("demo runs on a bus (--redis-url or the embedded Redis), not --gateway")
    out = Output(args.json)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        code = asyncio.run(_run(args, out))
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except QueueNotFoundError as exc:
        out.error(str(exc))
        code = EXIT_NOT_FOUND
    except (RecordError, InvalidMessageError) as exc:
        out.error(str(exc))
        code = EXIT_BAD_INPUT
    except (BusError, OSError, ValueError) as exc:
        out.error(f"{exc} ({type(exc).__name__})")
        code = EXIT_FAILED
    finally:
        handle = getattr(args, "file", None)  # import's, opened by the parser
        if isinstance(handle, io.IOBase) and handle not in (sys.stdin, sys.stdout):
            with contextlib.suppress(OSError):
                handle.close()
    sys.exit(code)
