"""``busmq.v1.PersistableService``: save, load, keep alive and delete persistable objects.

Each call builds a core ``Persistable`` tracking the fields the request names: on save
every one counts as changed, so exactly the fields the client sent are written.
"""

from __future__ import annotations

import json

import grpc

from busmq import Bus, Persistable
from busmq.v1 import persistable_service_pb2 as pb
from busmq.v1 import persistable_service_pb2_grpc as pb_grpc

from .convert import duration, json_fields, optional_seconds
from .errors import NotFound, RequestError, unary

_NO_FIELD = ("-",)
"""Tracked fields of a handle used for the expiry or deletion only (a Persistable tracks
at least one; none is read or written)."""


class PersistableService(pb_grpc.PersistableServiceServicer):
    def __init__(self, bus: Bus) -> None:
        self._bus = bus

    @unary
    async def SavePersistable(
        self, request: pb.SavePersistableRequest, context: grpc.aio.ServicerContext
    ) -> pb.SavePersistableResponse:
        if not request.fields:
            raise RequestError("fields must name at least one field")
        values = json_fields(dict(request.fields))
        obj = Persistable(self._bus, request.name, values, ttl=optional_seconds(request, "ttl"))
        await obj.save()
        return pb.SavePersistableResponse()

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
        obj = Persistable(self._bus, request.name, _NO_FIELD, ttl=optional_seconds(request, "ttl"))
        if not await obj.touch():
            raise NotFound(f"persistable {request.name!r} does not exist", "PERSISTABLE_NOT_FOUND")
        return pb.RenewPersistableResponse()

    @unary
    async def DeletePersistable(
        self, request: pb.DeletePersistableRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeletePersistableResponse:
        await Persistable(self._bus, request.name, _NO_FIELD).delete()
        return pb.DeletePersistableResponse()
