""":class:`~busmq.cli.admin.Admin` through a gateway (``busmq --gateway URL``): the
QueueService RPCs, with the gateway's secret and, for ``https://``, its CA."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from ..controls import RateLimit
from ..errors import QueueNotFoundError
from ..federation.convert import message_from_proto, outgoing, seconds
from ..federation.errors import from_rpc_error
from ..federation.remote_schema import schema_of
from ..federation.settings import grpc_address, normalize_url
from ..inventory import QueueStats
from ..keys import dead_letter_name
from ..message import EncodedMessage, Message
from ..protobuf_schema import ProtobufSchema
from ..schemas import Compatibility, Schema, SchemaVersion, Violation
from ..v1 import queue_service_pb2 as pb
from ..v1 import queue_service_pb2_grpc
from ..wire import COMPATIBILITY_FROM_PROTO, COMPATIBILITY_TO_PROTO
from .admin import SchemaState, details

PAGE = 1000
MAX_MESSAGE = 64 * 1024 * 1024


class GatewayAdmin:
    """:class:`~busmq.cli.admin.Admin` on the bus behind a gateway."""

    def __init__(
        self,
        url: str,
        secret: str | None = None,
        ca_file: Path | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.where = normalize_url(url)
        self._timeout = timeout
        self._metadata = (("authorization", f"Bearer {secret}"),) if secret else ()
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
        ]
        address = grpc_address(self.where)
        if self.where.startswith("https://"):
            root = ca_file.read_bytes() if ca_file else None
            credentials = grpc.ssl_channel_credentials(root_certificates=root)
            self._channel = grpc.aio.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(address, options=options)
        stub: Any = queue_service_pb2_grpc.QueueServiceStub
        self._stub = stub(self._channel)
        self._attachments: dict[str, str] = {}

    async def connect(self) -> None:
        await self.queues(prefix="\x00")  # checks the address and the secret at once

    @contextlib.contextmanager
    def _errors(self, queue: str) -> Iterator[None]:
        try:
            yield
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, queue=queue, target=self.where) from None

    async def _call(self, method: str, request: Any, queue: str = "") -> Any:
        with self._errors(queue):
            return await getattr(self._stub, method)(
                request, metadata=self._metadata, timeout=self._timeout
            )

    async def queues(self, prefix: str = "") -> list[QueueStats]:
        found: list[QueueStats] = []
        token = ""
        while True:
            request = pb.ListQueuesRequest(prefix=prefix, page_size=PAGE, page_token=token)
            response = await self._call("ListQueues", request)
            found += [_stats(summary) for summary in response.queues]
            token = response.next_page_token
            if not token:
                return found

    async def inspect(self, name: str) -> dict[str, Any]:
        response = await self._call("GetQueue", pb.GetQueueRequest(queue=name), name)
        found = [s for s in await self.queues(name) if s.name == name]
        if not found:  # closed in between
            raise QueueNotFoundError(name)
        oldest = None
        if response.HasField("oldest_ordered_wait"):
            oldest = response.oldest_ordered_wait.ToTimedelta().total_seconds()
        return details(
            found[0],
            max_deliveries=response.max_deliveries or None,
            drop_expired=response.drop_expired,
            oldest_ordered_wait_seconds=oldest,
            metadata=dict(response.metadata),
        )

    async def browse(
        self, name: str, from_id: int, to_id: int | None, follow: bool
    ) -> AsyncIterator[list[Message]]:
        request = pb.BrowseQueueRequest(
            queue=name, from_id=from_id, to_id=to_id or 0, follow=follow
        )
        call = self._stub.BrowseQueue(request, metadata=self._metadata)
        try:
            with self._errors(name):
                async for response in call:
                    if response.WhichOneof("event") == "messages":
                        yield [message_from_proto(m) for m in response.messages.messages]
        finally:
            call.cancel()

    async def open_for_push(self, name: str, ttl: float | None) -> None:
        if name in self._attachments:
            return
        request = pb.AttachQueueRequest(queue=name)
        if ttl is not None:
            request.ttl.FromNanoseconds(int(ttl * 1e9))
        response = await self._call("AttachQueue", request, name)
        self._attachments[name] = response.attachment_id

    async def push(self, name: str, messages: Sequence[EncodedMessage]) -> list[int]:
        request = pb.PushRequest(queue=name, messages=outgoing(messages))
        response = await self._call("Push", request, name)
        return list(response.ids)

    async def requeue_dead(self, name: str, ids: Sequence[int], limit: int) -> list[int]:
        request = pb.RequeueDeadRequest(queue=name, ids=ids, limit=limit)
        return list((await self._call("RequeueDead", request, name)).ids)

    async def purge(self, name: str) -> None:
        dead = dead_letter_name(name)
        await self._call("GetQueue", pb.GetQueueRequest(queue=dead), dead)  # NOT_FOUND if none
        await self._call("FlushQueue", pb.FlushQueueRequest(queue=dead), dead)

    async def schema(self, name: str) -> SchemaState:
        request = pb.GetQueueSchemaRequest(queue=name)
        response = await self._call("GetQueueSchema", request, name)
        mode = COMPATIBILITY_FROM_PROTO.get(response.compatibility, Compatibility.BACKWARD)
        versions = [_version(v) for v in response.versions]
        return SchemaState(response.current_version or None, mode, versions)

    async def set_schema(
        self, name: str, schema: Schema, compatibility: Compatibility | None
    ) -> SchemaVersion:
        request = pb.SetQueueSchemaRequest(
            queue=name,
            json_schema="" if isinstance(schema, ProtobufSchema) else json.dumps(schema.document),
            compatibility=(
                pb.SCHEMA_COMPATIBILITY_UNSPECIFIED
                if compatibility is None
                else COMPATIBILITY_TO_PROTO[compatibility]
            ),
        )
        if isinstance(schema, ProtobufSchema):
            request.protobuf.descriptor_set = schema.descriptor_set
            request.protobuf.message = schema.message
            request.protobuf.allow_unknown = schema.allow_unknown
        return _version((await self._call("SetQueueSchema", request, name)).version)

    async def remove_schema(self, name: str) -> None:
        await self._call("RemoveQueueSchema", pb.RemoveQueueSchemaRequest(queue=name), name)

    async def check_schema(
        self, name: str, messages: Sequence[EncodedMessage]
    ) -> tuple[int, list[Violation]] | None:
        request = pb.CheckQueueSchemaRequest(queue=name, messages=outgoing(messages))
        response = await self._call("CheckQueueSchema", request, name)
        if not response.version:
            return None
        found = [Violation(v.index, v.pointer, v.rule, v.message) for v in response.violations]
        return response.version, found

    async def close(self) -> None:
        for name, attachment in self._attachments.items():
            with contextlib.suppress(Exception):
                request = pb.DetachQueueRequest(attachment_id=attachment)
                await self._call("DetachQueue", request, name)
        await self._channel.close()


def _stats(summary: pb.QueueSummary) -> QueueStats:
    return QueueStats(
        name=summary.queue,
        shard=summary.shard,
        messages=summary.count,
        ready=summary.ready,
        pending=summary.pending,
        oldest_pending_seconds=seconds(summary.oldest_pending),
        consumers=summary.consumers,
        attachments=summary.attachments,
        delayed=summary.delayed,
        dead_letters=summary.dead_letters,
        last_id=summary.last_id,
        delivered=summary.delivered,
        mode=summary.mode or None,
        paused=summary.paused,
        ttl=seconds(summary.ttl),
        rate_limit=_limit(summary.rate_limit) if summary.HasField("rate_limit") else None,
        key_rate_limit=(
            _limit(summary.key_rate_limit) if summary.HasField("key_rate_limit") else None
        ),
        ordering=summary.ordering_key or None,
        ordered_keys_in_flight=summary.ordered_keys_in_flight,
        ordered_waiting=summary.ordered_waiting,
    )


def _version(proto: pb.SchemaVersion) -> SchemaVersion:
    return SchemaVersion(proto.version, schema_of(proto), proto.create_time.ToMilliseconds())


def _limit(proto: pb.RateLimit) -> RateLimit:
    return RateLimit(proto.limit, seconds(proto.per), proto.key or None)
