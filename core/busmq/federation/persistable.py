"""Federated persistables: a persistable that lives behind a remote gateway.

``bus.federate(bus.persistable("profile", ["name", "visits"], ttl=60), url)`` returns a
:class:`FederatedPersistable`: the field tracking, events and keep-alive of
:class:`busmq.Persistable` (it is the same :class:`~busmq.persistable.PersistableBase`)
with the storage calls going to the gateway's ``busmq.v1.PersistableService``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import duration_pb2

from ..events import Event
from ..persistable import Persistable, PersistableBase
from ..v1 import persistable_service_pb2 as pb
from ..v1 import persistable_service_pb2_grpc as pb_grpc
from .convert import seconds
from .errors import error_reason, from_rpc_error
from .link import Link
from .linked import Linked

if TYPE_CHECKING:
    from .context import FederationContext

PERSISTABLE_NOT_FOUND = "PERSISTABLE_NOT_FOUND"


class FederatedPersistable(PersistableBase, Linked):
    """A persistable in another datacenter, used through its gateway.

    Same API and events as :class:`busmq.Persistable`: mapping access to the tracked
    fields, ``changed``, ``update``, ``save()`` (only the changed fields travel, so
    writers of different fields in either datacenter never clobber each other),
    ``load()``, ``exists()``, ``remaining_ttl()``, ``delete()``, ``persist()`` /
    ``touch()`` / ``unpersist()``, ``close()``, ``async with``; events ``saved``,
    ``loaded``, ``persisting``, ``unpersisted``, ``error``. The link's events are
    re-emitted on ``events`` with the link URL as ``source``: ``ready``,
    ``unauthorized``, ``closed`` (the link), ``error`` and ``state``.

    Differences that come from the network:

    * Calls fail fast with :class:`~busmq.BusUnavailableError` while the link is not
      usable (and :class:`~busmq.federation.FederationUnauthorizedError` while the
      gateway refuses the credentials); a call made while the link is still connecting
      waits for its first probe.
    * Saves are **not** queued in the outbox. A persistable is last-writer-wins state:
      a save replayed after an outage could overwrite a newer value written meanwhile
      in the other datacenter. A failed save leaves its fields changed, so the caller
      decides whether to save again once the link is back. A save that failed
      ``UNAVAILABLE`` or timed out may or may not have been stored.
    * While persisted, a renewal that fails (link down) is an ``error`` event and the
      renewal goes on; when the link becomes ready again it renews at once, since the
      object may be close to expiring. An object that expired during the outage is not
      recreated by renewal (as locally): ``touch()`` returns False, ``save()`` it again.

    Args:
        manager: the bus's federation manager (which tracks this object).
        link: the link to the gateway.
        persistable: the description: its name, tracked fields (their current values
            are the defaults here) and ttl. Nothing of it is used locally.
    """

    def __init__(self, manager: FederationContext, link: Link, persistable: Persistable) -> None:
        fields = dict(persistable)
        store = GatewayStore(link, persistable.name, next(iter(fields)))
        super().__init__(persistable.name, fields, ttl=persistable.ttl, store=store)
        self.link = link

    # The manager tracks federated objects in a weak set, so they hash by identity;
    # equality stays the mapping's (equal values), as for a local persistable.
    __hash__ = object.__hash__

    def _on_link_event(self, event: Event) -> None:
        if "queue" in event.details:
            return  # about one federated queue of the link (e.g. an outbox dead letter)
        if event.kind == "ready" and self.persisted:
            self._renew_now.set()
        self.events.emit(event)

    async def _release(self) -> None:
        await self.unpersist()

    async def _stop_local(self) -> None:
        await self._stop_renewing()


class GatewayStore:
    """A persistable's storage through ``busmq.v1.PersistableService``.

    ``probe_field`` is the field named by the ``LoadPersistable`` calls behind
    ``exists`` and ``pttl`` (the request must name at least one; one is the least
    transferred).
    """

    def __init__(self, link: Link, name: str, probe_field: str) -> None:
        self.name = name
        self._link = link
        self._probe_field = probe_field

    async def write(
        self, fields: Mapping[str, str], ttl_ms: int, defaults: Mapping[str, str]
    ) -> dict[str, str]:
        request = pb.SavePersistableRequest(
            name=self.name, fields=fields, defaults=defaults, ttl=_duration(ttl_ms)
        )
        response = await self._call("SavePersistable", request)
        assert response is not None  # only renewals may find the object missing
        return dict(response.defaults)

    async def read(self, fields: Collection[str]) -> dict[str, str] | None:
        response = await self._load(fields)
        return dict(response.fields) if response.exists else None

    async def exists(self) -> bool:
        return bool((await self._load([self._probe_field])).exists)

    async def pttl(self) -> int | None:
        response = await self._load([self._probe_field])
        if not response.exists or not response.HasField("ttl"):
            return None
        return round(seconds(response.ttl) * 1000)

    async def delete(self) -> None:
        await self._call("DeletePersistable", pb.DeletePersistableRequest(name=self.name))

    async def expire(self, ttl_ms: int) -> bool:
        request = pb.RenewPersistableRequest(name=self.name, ttl=_duration(ttl_ms))
        return await self._call("RenewPersistable", request, missing_ok=True) is not None

    async def _load(self, fields: Collection[str]) -> pb.LoadPersistableResponse:
        request = pb.LoadPersistableRequest(name=self.name, fields=fields)
        response: pb.LoadPersistableResponse = await self._call("LoadPersistable", request)
        return response

    async def _call(self, method: str, request: Any, *, missing_ok: bool = False) -> Any:
        """One unary call, failing fast if the link is not usable (no
        ``wait_for_ready``). ``missing_ok``: ``None`` when the gateway answers that
        the object does not exist."""
        link = self._link
        # The link's state, not the manager's ``closed``: that is set before the objects
        # are released.
        await link.require_usable()
        try:
            return await link.call(method, request, kind=pb_grpc.PersistableServiceStub)
        except grpc.aio.AioRpcError as exc:
            if (
                missing_ok
                and exc.code() is grpc.StatusCode.NOT_FOUND
                and error_reason(exc) == PERSISTABLE_NOT_FOUND
            ):
                return None
            raise from_rpc_error(exc, queue=self.name, target=link.url) from None


def _duration(ms: int) -> duration_pb2.Duration:
    result = duration_pb2.Duration()
    result.FromMilliseconds(ms)
    return result
