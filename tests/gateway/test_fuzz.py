"""Fuzzing a real gateway process: hypothesis over every field of every request message
of every method, raw random bytes to every method, and garbage to the port. No call may
end UNKNOWN or INTERNAL, the process must keep serving, and what it logs must stay
bounded (no traceback, and a number of lines that does not grow with the calls)."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor, descriptor_pool, message_factory
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from busmq.v1 import (  # noqa: F401  (registers the services' descriptors)
    channel_service_pb2,
    persistable_service_pb2,
    queue_service_pb2,
    request_service_pb2,
)
from tests.support.redis_server import free_port

pytestmark = pytest.mark.slow

SECRET = "fuzz-secret-0123456789"
AUTH = (("authorization", f"Bearer {SECRET}"),)
SERVICES = (
    "busmq.v1.QueueService",
    "busmq.v1.ChannelService",
    "busmq.v1.PersistableService",
    "busmq.v1.RequestService",
)
FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
F = descriptor.FieldDescriptor
INTS = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1), F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1), F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1), F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1), F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1), F.TYPE_FIXED64: (0, 2**64 - 1),
}  # fmt: skip
NAMES = st.sampled_from(
    ["orders", "fuzz", "a" * 300, "", " ", "q:dead", "../x", "\x00", "é", "*", "{x}", "a b"]
)


def methods() -> list[descriptor.MethodDescriptor]:
    pool = descriptor_pool.Default()
    return [m for s in SERVICES for m in pool.FindServiceByName(s).methods]


def scalar(field: descriptor.FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type in INTS:
        low, high = INTS[field.type]
        return st.integers(low, high) | st.sampled_from([0, 1, low, high])
    if field.type == F.TYPE_BOOL:
        return st.booleans()
    if field.type == F.TYPE_STRING:
        return NAMES | st.text(max_size=40)
    if field.type == F.TYPE_BYTES:
        return st.binary(max_size=64) | st.sampled_from([b"{}", b"[1]", b"null", b"\xff"])
    if field.type == F.TYPE_ENUM:
        return st.integers(-3, 12)  # known values and unknown ones (open enums)
    if field.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    raise TypeError(field.type)


def messages(desc: descriptor.Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of type ``desc`` with any subset of their fields set to any value."""
    cls = message_factory.GetMessageClass(desc)
    if depth > 3:
        return st.just(cls())
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in desc.fields:
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            key, value = sub.fields_by_name["key"], sub.fields_by_name["value"]
            value_strategy = messages(value.message_type, depth + 1) if value.message_type \
                else scalar(value)  # fmt: skip
            fields[field.name] = st.dictionaries(scalar(key), value_strategy, max_size=4)
            continue
        one = messages(sub, depth + 1) if sub is not None else scalar(field)
        fields[field.name] = st.lists(one, max_size=4) if field.is_repeated else one
    return st.fixed_dictionaries({}, optional=fields).map(lambda values: _build(cls, values))


def _build(cls: type[Message], values: dict[str, Any]) -> Message:
    result = cls()
    for name, value in values.items():
        target = getattr(result, name)
        if isinstance(value, Message):
            target.CopyFrom(value)
        elif isinstance(value, list):
            if value and isinstance(value[0], Message):
                for item in value:
                    target.add().CopyFrom(item)
            else:
                target.extend(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, Message):
                    target[key].CopyFrom(item)
                else:
                    target[key] = item
        else:
            setattr(result, name, value)
    return result


class GatewayUnderFuzz:
    """A ``busmq-gateway`` process whose output is kept, line by line."""

    def __init__(self, redis_url: str) -> None:
        self.port = free_port()
        env = {**os.environ, "BUSMQ_LEASE_SECONDS": "3", "BUSMQ_GATEWAY_HTTP_LISTEN": "off"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "busmq_gateway", "--listen", f"127.0.0.1:{self.port}",
             "--redis-url", redis_url, f"--secret={SECRET}", "--log-format", "text",
             "--grace-seconds", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(30):
            self.stop()
            raise RuntimeError("gateway not ready:\n" + "".join(self.lines))

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if "busmq gateway ready" in line:
                self._ready.set()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A ``redis-server`` of the test's own on a free loopback port (a plain process: the
    fuzz test is synchronous, as hypothesis drives it); killed at the end."""
    from busmq.embedded import find_redis_server

    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [find_redis_server(), "--bind", "127.0.0.1", "--port", str(port), "--dir",
         str(directory), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.02)  # polling the port until the server binds it
        yield f"redis://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def fuzzed(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[GatewayUnderFuzz, grpc.Channel]]:
    with redis_server(tmp_path_factory.mktemp("fuzz") / "redis") as url:
        gateway = GatewayUnderFuzz(url)
        channel = grpc.insecure_channel(f"127.0.0.1:{gateway.port}")
        try:
            yield gateway, channel
        finally:
            channel.close()
            gateway.stop()


def call(
    channel: grpc.Channel, method: descriptor.MethodDescriptor, payload: bytes
) -> grpc.StatusCode:
    """Send ``payload`` as the request of ``method``; the call's status code (a server
    stream is read for a few responses, then cancelled)."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    if method.client_streaming:  # sent twice, then the client's side ends
        bidi = channel.stream_stream(path)(iter((payload, payload)), metadata=AUTH, timeout=0.5)
        try:
            for _ in bidi:
                pass
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return, attr-defined]
        return grpc.StatusCode.OK
    if method.server_streaming:
        stream = channel.unary_stream(path)(payload, metadata=AUTH, timeout=0.3)
        try:
            for count, _ in enumerate(stream):
                if count == 2:
                    stream.cancel()
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return, attr-defined]
        return grpc.StatusCode.OK
    try:
        channel.unary_unary(path)(payload, metadata=AUTH, timeout=0.5)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return, attr-defined]
    return grpc.StatusCode.OK


def requests() -> st.SearchStrategy[tuple[descriptor.MethodDescriptor, Message]]:
    return st.sampled_from(methods()).flatmap(
        lambda m: st.tuples(st.just(m), messages(m.input_type))
    )


@settings(
    max_examples=1000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=requests())
def test_any_field_values_never_end_unknown_or_internal(
    fuzzed: tuple[GatewayUnderFuzz, grpc.Channel],
    request: tuple[descriptor.MethodDescriptor, Message],
) -> None:
    _, channel = fuzzed
    method, message = request
    code = call(channel, method, message.SerializeToString())
    assert code not in FORBIDDEN, (method.full_name, message)


def test_random_bytes_and_port_garbage_leave_it_serving_with_a_bounded_log(
    fuzzed: tuple[GatewayUnderFuzz, grpc.Channel],
) -> None:
    gateway, channel = fuzzed
    rng = random.Random(20261125)
    before = len(gateway.lines)
    for _ in range(5):
        for method in methods():
            payload = rng.randbytes(rng.randrange(1, 200))
            assert call(channel, method, payload) not in FORBIDDEN, method.full_name
    # Garbage to the port: not HTTP/2, an HTTP/1.1 request, a preface then noise.
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    for blob in (
        rng.randbytes(4096),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        preface + rng.randbytes(512),
    ):
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
            sock.sendall(blob)
            sock.settimeout(1)
            with contextlib.suppress(TimeoutError, ConnectionError):
                sock.recv(1024)
    # Still serving, correctly.
    attach = channel.unary_unary(
        "/busmq.v1.QueueService/AttachQueue",
        request_serializer=queue_service_pb2.AttachQueueRequest.SerializeToString,
        response_deserializer=queue_service_pb2.AttachQueueResponse.FromString,
    )
    assert attach(
        queue_service_pb2.AttachQueueRequest(queue="after-fuzz"), metadata=AUTH, timeout=5
    )
    assert gateway.process.poll() is None
    logged = gateway.lines[before:]
    text = "".join(gateway.lines)
    assert "Traceback" not in text
    # 200 garbage calls and 3 garbage connections: the log grows by kinds of refusal,
    # at most once a minute each, not by calls.
    assert len(logged) <= 40, "".join(logged)
