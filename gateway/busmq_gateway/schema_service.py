"""Schemas per queue in ``busmq.v1.QueueService``: ``SetQueueSchema``,
``GetQueueSchema``, ``RemoveQueueSchema`` and ``CheckQueueSchema`` (see
:mod:`busmq.schemas`). Pushes are checked by the core, on every path."""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from busmq import Bus, InvalidSchemaError, JsonSchema, ProtobufSchema, SchemaVersion
from busmq import queue_schema as core_schema
from busmq.schemas import Schema
from busmq.v1 import queue_service_pb2 as pb
from busmq.wire import COMPATIBILITY_FROM_PROTO, COMPATIBILITY_TO_PROTO

from .convert import outgoing_batch
from .errors import unary


def version_proto(version: SchemaVersion) -> pb.SchemaVersion:
    created = timestamp_pb2.Timestamp()
    created.FromMilliseconds(version.created_ms)
    found = pb.SchemaVersion(version=version.version, create_time=created)
    schema = version.schema
    if isinstance(schema, ProtobufSchema):
        found.protobuf.descriptor_set = schema.descriptor_set
        found.protobuf.message = schema.message
        found.protobuf.allow_unknown = schema.allow_unknown
    else:
        found.json_schema = json.dumps(schema.document)
    return found


def parse_request(request: pb.SetQueueSchemaRequest) -> Schema:
    """The schema a SetQueueSchema names: its JSON Schema or its protobuf type."""
    if request.HasField("protobuf"):
        if request.json_schema:
            raise InvalidSchemaError("give json_schema or protobuf, not both")
        proto = request.protobuf
        return ProtobufSchema(bytes(proto.descriptor_set), proto.message, proto.allow_unknown)
    return parse_schema(request.json_schema)


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
        version = await queue.set_schema(parse_request(request), compatibility=mode)
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
