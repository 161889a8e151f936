"""Schemas per queue in ``busmq.v1.QueueService``: ``SetQueueSchema``,
``GetQueueSchema``, ``RemoveQueueSchema`` and ``CheckQueueSchema`` (see
:mod:`busmq.schemas`). Pushes are checked by the core, on every path."""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from busmq import Bus, InvalidSchemaError, JsonSchema, SchemaVersion
from busmq import queue_schema as core_schema
from busmq.v1 import queue_service_pb2 as pb
from busmq.wire import COMPATIBILITY_FROM_PROTO, COMPATIBILITY_TO_PROTO

from .convert import outgoing_batch
from .errors import unary


def version_proto(version: SchemaVersion) -> pb.SchemaVersion:
    created = timestamp_pb2.Timestamp()
    created.FromMilliseconds(version.created_ms)
    return pb.SchemaVersion(
        version=version.version,
        json_schema=json.dumps(version.schema.document),
        create_time=created,
    )


def parse_schema(text: str) -> JsonSchema:
    try:
        document: Any = json.loads(text)
    except ValueError as exc:
        raise InvalidSchemaError(f"json_schema is not JSON: {exc}") from None
    if not isinstance(document, dict | bool):
        raise InvalidSchemaError("json_schema is a JSON object (or true/false)")
    return JsonSchema(document)


class QueueSchemas:
    """The schema RPCs, mixed into the QueueService servicer."""

    _bus: Bus

    @unary
    async def SetQueueSchema(
        self, request: pb.SetQueueSchemaRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetQueueSchemaResponse:
        queue = self._bus.queue(request.queue)
        mode = COMPATIBILITY_FROM_PROTO.get(request.compatibility)
        version = await queue.set_schema(parse_schema(request.json_schema), compatibility=mode)
        return pb.SetQueueSchemaResponse(version=version_proto(version))

    @unary
    async def GetQueueSchema(
        self, request: pb.GetQueueSchemaRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetQueueSchemaResponse:
        queue = self._bus.queue(request.queue)
        await queue.store.require_exists()
        current, mode, versions = await core_schema.versions(queue.store)
        return pb.GetQueueSchemaResponse(
            current_version=current or 0,
            compatibility=COMPATIBILITY_TO_PROTO[mode],
            versions=[version_proto(v) for v in versions],
        )

    @unary
    async def RemoveQueueSchema(
        self, request: pb.RemoveQueueSchemaRequest, context: grpc.aio.ServicerContext
    ) -> pb.RemoveQueueSchemaResponse:
        await self._bus.queue(request.queue).remove_schema()
        return pb.RemoveQueueSchemaResponse()

    @unary
    async def CheckQueueSchema(
        self, request: pb.CheckQueueSchemaRequest, context: grpc.aio.ServicerContext
    ) -> pb.CheckQueueSchemaResponse:
        queue = self._bus.queue(request.queue)
        encoded = outgoing_batch(request.messages, self._bus.settings.max_message_bytes)
        checked = await queue.check_schema([m.payload for m in encoded])
        if checked is None:
            return pb.CheckQueueSchemaResponse()
        version, violations = checked
        return pb.CheckQueueSchemaResponse(
            version=version,
            violations=[
                pb.SchemaViolation(index=v.index, pointer=v.pointer, rule=v.rule, message=v.message)
                for v in violations
            ],
        )
