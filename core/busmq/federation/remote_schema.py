"""The schema of a queue behind a gateway, as this process last fetched it: a push that
does not fit is refused here, before it reaches the link or the outbox (see
:mod:`busmq.schemas`). The gateway still checks every push on arrival; a push kept in the
outbox while the schema changed is refused then, and goes to the outbox's dead letters."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..errors import BusError
from ..protobuf_schema import ProtobufSchema
from ..schemas import Compiled, JsonSchema, Schema, SchemaError, version_token
from ..v1 import queue_service_pb2 as pb

log = logging.getLogger(__name__)

Call = Callable[[str, Any], Awaitable[Any]]


class RemoteSchema:
    """A remote queue's current schema version, compiled (``None``: none, or unknown)."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.compiled: Compiled | None = None

    async def refresh(self, call: Call) -> None:
        """Fetch the queue's current version (``GetQueueSchema``). A gateway that does
        not know the RPC, or any failure, leaves the check to the gateway on arrival."""
        try:
            reply = await call("GetQueueSchema", pb.GetQueueSchemaRequest(queue=self.queue))
        except BusError as exc:
            log.debug("schema of federated %s not fetched: %s", self.queue, exc)
            return
        current = next((v for v in reply.versions if v.version == reply.current_version), None)
        if current is None:
            self.compiled = None
            return
        token = version_token(current.version, current.create_time.ToMilliseconds())
        if self.compiled is None or self.compiled.token != token:  # (a queue made again)
            self.compiled = Compiled(current.version, schema_of(current), token)

    async def check(self, payloads: Sequence[bytes], call: Call) -> None:
        """:class:`SchemaError` if a payload does not fit the queue's version: the cached
        one, fetched again before refusing (another may have replaced it)."""
        if self.compiled is None or not self.compiled.violations(payloads):
            return
        await self.refresh(call)
        compiled = self.compiled
        violations = [] if compiled is None else compiled.violations(payloads)
        if compiled is not None and violations:
            raise SchemaError(self.queue, compiled.version, violations)


def schema_of(version: pb.SchemaVersion) -> Schema:
    """The schema a ``SchemaVersion`` carries: its protobuf type, or its JSON Schema."""
    if version.HasField("protobuf"):
        proto = version.protobuf
        return ProtobufSchema(bytes(proto.descriptor_set), proto.message, proto.allow_unknown)
    return JsonSchema(json.loads(version.json_schema))
