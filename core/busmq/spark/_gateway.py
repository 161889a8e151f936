"""The Spark data source's queues reached through a busmq gateway (option ``gateway_url``),
for Spark clusters that cannot reach Redis: the same operations as :mod:`._core`'s Redis
ones, as gRPC calls (``GetQueue``, ``BrowseQueue``, ``AttachQueue``, ``PushMany``).

The gateway's address, secret and TLS settings are checked in the driver as a
federation target's are (:class:`busmq.federation.FederationTarget`: ``https://`` with
a verified certificate, or ``http://`` to loopback unless ``allow_plaintext``); the PEM
files are read there too and shipped to the executors with the plan, so they need not
exist on the executors' machines.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_status import rpc_status

from ..errors import BusError
from ..federation.errors import from_status, status_info
from ..federation.settings import FederationTarget, grpc_address
from ..message import PayloadKind
from ..v1 import queue_service_pb2 as pb
from ..v1 import queue_service_pb2_grpc as pb_grpc
from ..v1 import types_pb2
from ..wire import KIND_FROM_PROTO, KIND_TO_PROTO
from ._core import KIND_NAMES, READ_PAGE, OptionError, Page, Span, _get, parse_bool

CALL_TIMEOUT = 30.0
_MAX_MESSAGE = 64 * 1024 * 1024


@dataclass(frozen=True)
class Gateway:
    """How to reach a gateway: its URL, secret and TLS material (never in ``repr``)."""

    url: str
    secret: str | None = field(default=None, repr=False)
    root_ca: bytes | None = field(default=None, repr=False)
    client_key: bytes | None = field(default=None, repr=False)
    client_cert: bytes | None = field(default=None, repr=False)
    server_name: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Gateway | None:
        """The gateway of options ``gateway_url``, ``secret``, ``root_ca_file``,
        ``client_cert_file``, ``client_key_file``, ``server_name`` and
        ``allow_plaintext``; ``None`` without ``gateway_url`` (Redis is reached)."""
        url = _get(options, "gateway_url")
        if url is None or not url.strip():
            return None
        if _get(options, "redis_urls"):
            raise OptionError("options 'gateway_url' and 'redis_urls' exclude each other")
        try:
            target = FederationTarget(
                url.strip(),
                secret=_get(options, "secret"),
                root_ca_file=_get(options, "root_ca_file"),  # type: ignore[arg-type]
                client_cert_file=_get(options, "client_cert_file"),  # type: ignore[arg-type]
                client_key_file=_get(options, "client_key_file"),  # type: ignore[arg-type]
                server_name=_get(options, "server_name"),
                allow_plaintext=parse_bool(options, "allow_plaintext"),
            )
            root, key, chain = target.read_credentials()
        except (ValueError, OSError) as exc:
            raise OptionError(f"option 'gateway_url': {exc}") from None
        return cls(target.url, target.secret, root, key, chain, target.server_name)

    @contextlib.contextmanager
    def stub(self) -> Iterator[Any]:
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
        ]
        address = grpc_address(self.url)
        if self.url.startswith("https://"):
            if self.server_name:
                options.append(("grpc.ssl_target_name_override", self.server_name))
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self.root_ca,
                private_key=self.client_key,
                certificate_chain=self.client_cert,
            )
            channel = grpc.secure_channel(address, credentials, options=options)
        else:
            channel = grpc.insecure_channel(address, options=options)
        stub_class: type[Any] = pb_grpc.QueueServiceStub  # generated, untyped
        with channel:
            yield stub_class(channel)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.secret}"),) if self.secret else ()

    # -- the driver's questions ------------------------------------------------------

    def queue_info(self, queue: str) -> pb.GetQueueResponse | None:
        """``GetQueue``; ``None`` if the queue does not exist."""
        with self.stub() as stub:
            try:
                response: pb.GetQueueResponse = stub.GetQueue(
                    pb.GetQueueRequest(queue=queue), metadata=self.metadata, timeout=CALL_TIMEOUT
                )
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                what = f"{exc.code().name}: {exc.details()}"
                raise OptionError(f"gateway {self.url}: {what}") from None
        return response

    def require(self, queue: str) -> pb.GetQueueResponse:
        info = self.queue_info(queue)
        if info is None:
            raise OptionError(f"unknown queue {queue!r} on gateway {self.url} (attach it)")
        return info

    def last_id(self, queue: str) -> int:
        return int(self.require(queue).last_id)

    def first_id(self, queue: str) -> int | None:
        for message in self._browse(queue, 0, 0):
            return int(message.id)
        return None

    def dropped_through(self, queue: str) -> int:
        """As :func:`._core.dropped_through`, from ``GetQueue`` and the first stored id."""
        info = self.require(queue)
        if info.mode == "destructive" or info.delayed:
            return 0
        first = self.first_id(queue)
        return int(info.last_id) if first is None else first - 1

    def attach(self, queue: str, ttl_seconds: float, create: bool) -> bool:
        """Create the queue (``create``) or keep it alive for ``ttl_seconds`` more: an
        attachment taken and given up at once (the queue then lives ``ttl``); whether it
        exists."""
        if not create and self.queue_info(queue) is None:
            return False
        request = pb.AttachQueueRequest(queue=queue)
        request.ttl.FromMilliseconds(int(ttl_seconds * 1000))
        with self.stub() as stub:
            attached = stub.AttachQueue(request, metadata=self.metadata, timeout=CALL_TIMEOUT)
            stub.DetachQueue(
                pb.DetachQueueRequest(attachment_id=attached.attachment_id),
                metadata=self.metadata,
                timeout=CALL_TIMEOUT,
            )
        return True

    # -- the executors' work ---------------------------------------------------------

    def _browse(self, queue: str, low: int, high: int) -> Iterator[types_pb2.Message]:
        request = pb.BrowseQueueRequest(queue=queue, from_id=low, to_id=high)
        with self.stub() as stub:
            stream = stub.BrowseQueue(request, metadata=self.metadata)
            try:
                for response in stream:
                    if response.WhichOneof("event") == "messages":
                        yield from response.messages.messages
            finally:
                stream.cancel()

    def read_pages(self, span: Span) -> Iterator[Page]:
        """The messages of ``span`` in id order, a page per batch the gateway sends."""
        page = Page([], [], [], [], [], [])
        for message in self._browse(span.queue, span.low, span.high):
            kind = KIND_FROM_PROTO[message.kind].value
            page.ids.append(int(message.id))
            page.payloads.append(message.payload)
            page.kinds.append(KIND_NAMES[kind])
            page.headers.append(list(message.headers.items()))
            page.stamps.append(message.push_time.ToMilliseconds())
            page.json.append(message.payload.decode("utf-8") if kind == b"j" else None)
            if len(page.ids) >= READ_PAGE:
                yield page
                page = Page([], [], [], [], [], [])
        if page.ids:
            yield page

    def push(
        self,
        stub: Any,
        queue: str,
        flat: Sequence[bytes | str],
        request_id: str,
        producer: tuple[str, int] | None,
    ) -> tuple[int, bool]:
        """One batch of (payload, kind, headers) triples, as :func:`._core.push` stores
        it: by producer sequence, else by ``request_id`` (the gateway's dedupe window)."""
        request = pb.PushRequest(queue=queue, request_id=request_id)
        for i in range(0, len(flat), 3):
            payload, kind, headers = flat[i], flat[i + 1], flat[i + 2]
            code = kind.encode() if isinstance(kind, str) else kind
            request.messages.add(
                payload=payload,
                kind=KIND_TO_PROTO[PayloadKind(code)],
                headers=json.loads(headers) if headers else {},
            )
        if producer is not None:
            request.producer, request.producer_sequence = producer
        try:
            response = stub.Push(request, metadata=self.metadata, timeout=CALL_TIMEOUT)
        except grpc.RpcError as exc:
            refused = schema_refusal(exc, queue, self.url)
            if refused is not None:
                raise refused from None
            raise RuntimeError(
                f"busmq push to {queue!r} through {self.url}: {exc.code().name}: {exc.details()}"
            ) from None
        first = int(response.ids[0]) if response.ids else 0
        return first, bool(response.duplicate)


def schema_refusal(error: grpc.RpcError, queue: str, url: str) -> BusError | None:
    """The :class:`~busmq.schemas.SchemaError` (with its violations) of a push the gateway
    refused for the queue's schema, else ``None``."""
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # an inconsistent rich status: not one of the gateway's
        return None
    if status is None or status_info(status)[0] != "SCHEMA":
        return None
    return from_status(status, queue=queue, target=url)
