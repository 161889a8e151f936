"""``busmq.v1.PersistableService``: save, load, keep alive and delete persistable objects.

Saves, renewals and deletions go to the stored object (``RedisStore``): a save writes
exactly the fields the client sent (its defaults only where the object lacks them).
Loads build a core ``Persistable`` tracking the fields the request names.
"""

from __future__ import annotations

import json

import grpc

from busmq import Bus, Persistable
from busmq.keys import validate_name
from busmq.persistable import RedisStore
from busmq.v1 import persistable_service_pb2 as pb
from busmq.v1 import persistable_service_pb2_grpc as pb_grpc

from .convert import check_json_fields, duration, optional_seconds
from .errors import NotFound, RequestError, unary


class PersistableService(pb_grpc.PersistableServiceServicer):
    def __init__(self, bus: Bus) -> None:
        self._bus = bus

    @unary
    async def SavePersistable(
        self, request: pb.SavePersistableRequest, context: grpc.aio.ServicerContext
    ) -> pb.SavePersistableResponse:
        if not request.fields and not request.defaults:
            raise RequestError("fields or defaults must name at least one field")
        fields, defaults = dict(request.fields), dict(request.defaults)
        if both := fields.keys() & defaults.keys():
            raise RequestError(f"fields named both as a field and a default: {sorted(both)}")
        check_json_fields(fields | defaults)
        stored = await self._store(request.name).write(fields, self._ttl_ms(request), defaults)
        return pb.SavePersistableResponse(defaults=stored)

    @unary
    async def LoadPersistable(
        self, request: pb.LoadPersistableRequest, context: grpc.aio.ServicerContext
    ) -> pb.LoadPersistableResponse:
        if not request.fields:
            raise RequestError("fields must name at least one field")
        obj = Persistable(self._bus, request.name, list(request.fields))
        exists = await obj.load()
        response = pb.LoadPersistableResponse(exists=exists)
        if not exists:
            return response
        # After a load, the fields that differ from the store are those it lacks.
        missing = obj.changed
        for name, value in obj.items():
            if name not in missing:
                response.fields[name] = json.dumps(value, separators=(",", ":"))
        ttl = await obj.remaining_ttl()
        if ttl is not None:
            response.ttl.CopyFrom(duration(ttl))
        return response

    @unary
    async def RenewPersistable(
        self, request: pb.RenewPersistableRequest, context: grpc.aio.ServicerContext
    ) -> pb.RenewPersistableResponse:
        if not await self._store(request.name).expire(self._ttl_ms(request)):
            raise NotFound(f"persistable {request.name!r} does not exist", "PERSISTABLE_NOT_FOUND")
        return pb.RenewPersistableResponse()

    @unary
    async def DeletePersistable(
        self, request: pb.DeletePersistableRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeletePersistableResponse:
        await self._store(request.name).delete()
        return pb.DeletePersistableResponse()

    def _ttl_ms(self, request: pb.SavePersistableRequest | pb.RenewPersistableRequest) -> int:
        ttl = optional_seconds(request, "ttl", self._bus.settings.default_ttl)
        assert ttl is not None
        return max(1, int(ttl * 1000))

    def _store(self, name: str) -> RedisStore:
        """The stored object alone, for calls that read and write no field."""
        return RedisStore(self._bus, validate_name(name))
