"""Who is calling, and may they: authentication, authorization and per-principal limits,
applied to every busmq RPC by the method guard (:mod:`busmq_gateway.malformed`).

A caller is authenticated by its bearer secret (looked up by SHA-256 digest, so the
lookup time tells nothing about the secret) or, on an mTLS port, by its verified client
certificate (common name or a subject alternative name). Each method names the object
kind, the verb it needs and the object names it touches:

    queues        push: Push, PushMany,         consume: Consume
                  PushStream (each request)
                  ack: Ack, Nack, Reject        admin: RequeueDead, UpdateQueueControls,
                  any verb: AttachQueue,               UpdateQueueMetadata, FlushQueue,
                  GetQueue (ListQueues shows           CloseQueue, BrowseQueue
                  the queues with any verb)
    channels      push and consume: ConnectChannel      push: SendToRole     ack: AckChannel
    persistables  push: Save, Renew      consume: Load      admin: Delete
    services      push: Call, CallStream                consume: Serve

Calls that name a token handed out by an earlier, authorized call (an attachment id, a
consumer id, a channel connection id, a served request id) need the token *and* to come
from the principal it was handed to (:func:`check_owner`): a token that leaked into a log
or a ticket is of no use to another principal. A refused call ends
``PERMISSION_DENIED`` with ``ErrorInfo`` reason ``PERMISSION_DENIED`` (metadata:
principal, kind, verb, name; for a token, principal and token kind); a principal over its
limits ``RESOURCE_EXHAUSTED`` with reason ``STREAM_LIMIT`` or ``PUSH_RATE_LIMIT``
(metadata ``retry_after_ms``). Refusals are logged with the principal's name, once per
interval with a count. Secrets are never logged.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from .errors import RequestError
from .principals import ALL_VERBS, Grant, Kind, Principal, Verb
from .throttle import INTERVAL_SECONDS, ThrottledLog

log = logging.getLogger(__name__)

ANONYMOUS = Principal(
    "anonymous", grants=tuple(Grant(kind, ("*",), ALL_VERBS) for kind in Kind), metrics=True
)
CURRENT: contextvars.ContextVar[Principal] = contextvars.ContextVar("busmq_principal")
"""The principal of the call being served (set by the guard, read by servicers that
filter what they show, such as ListQueues, and that hand out tokens)."""
CURRENT_ACCESS: contextvars.ContextVar[Access] = contextvars.ContextVar("busmq_access")

Names = Callable[[Any], Iterable[str]]


@dataclass(frozen=True)
class Rule:
    """What a method needs: ``verbs`` (all of them; empty: any one) on the objects of
    ``kind`` named by ``names(request)``; ``cost(request)`` messages against the
    principal's push rate."""

    kind: Kind | None
    verbs: tuple[Verb, ...] = ()
    names: Names = lambda request: ()
    cost: Callable[[Any], int] = lambda request: 0


def _field(name: str) -> Names:
    return lambda request: (getattr(request, name),)


def _messages(request: Any) -> int:
    return len(request.messages)


_Q, _C, _P, _S = Kind.QUEUE, Kind.CHANNEL, Kind.PERSISTABLE, Kind.SERVICE
_PUSH, _CONSUME, _ACK, _ADMIN = Verb.PUSH, Verb.CONSUME, Verb.ACK, Verb.ADMIN
_queue, _channel, _name, _service = (
    _field("queue"),
    _field("channel"),
    _field("name"),
    _field("service"),
)
TOKEN = Rule(None)  # authenticated only: the request names a token from an earlier call

RULES: dict[str, Rule] = {
    "/busmq.v1.QueueService/AttachQueue": Rule(_Q, (), _queue),
    "/busmq.v1.QueueService/RenewAttachment": TOKEN,
    "/busmq.v1.QueueService/DetachQueue": TOKEN,
    "/busmq.v1.QueueService/Push": Rule(_Q, (_PUSH,), _queue, _messages),
    "/busmq.v1.QueueService/PushMany": Rule(
        _Q,
        (_PUSH,),
        lambda r: [p.queue for p in r.pushes],
        lambda r: sum(len(p.messages) for p in r.pushes),
    ),
    # Checked per request: a refused push is answered with its error, the stream goes on.
    "/busmq.v1.QueueService/PushStream": Rule(
        _Q, (_PUSH,), lambda r: (r.push.queue,), lambda r: len(r.push.messages)
    ),
    "/busmq.v1.QueueService/Consume": Rule(_Q, (_CONSUME,), _queue),
    "/busmq.v1.QueueService/Ack": Rule(_Q, (_ACK,), _queue),
    "/busmq.v1.QueueService/Nack": Rule(_Q, (_ACK,), _queue),
    "/busmq.v1.QueueService/Reject": Rule(_Q, (_ACK,), _queue),
    "/busmq.v1.QueueService/RequeueDead": Rule(_Q, (_ADMIN,), _queue),
    "/busmq.v1.QueueService/UpdateQueueControls": Rule(_Q, (_ADMIN,), _queue),
    "/busmq.v1.QueueService/GetQueue": Rule(_Q, (), _queue),
    "/busmq.v1.QueueService/UpdateQueueMetadata": Rule(_Q, (_ADMIN,), _queue),
    "/busmq.v1.QueueService/FlushQueue": Rule(_Q, (_ADMIN,), _queue),
    "/busmq.v1.QueueService/CloseQueue": Rule(_Q, (_ADMIN,), _queue),
    "/busmq.v1.QueueService/ListQueues": TOKEN,  # filtered to what the caller may see
    "/busmq.v1.QueueService/BrowseQueue": Rule(_Q, (_ADMIN,), _queue),
    "/busmq.v1.QueueService/SetQueueSchema": Rule(_Q, (_ADMIN,), _queue),
    "/busmq.v1.QueueService/GetQueueSchema": Rule(_Q, (), _queue),
    "/busmq.v1.QueueService/RemoveQueueSchema": Rule(_Q, (_ADMIN,), _queue),
    "/busmq.v1.QueueService/CheckQueueSchema": Rule(_Q, (_PUSH,), _queue),
    "/busmq.v1.ChannelService/ConnectChannel": Rule(_C, (_PUSH, _CONSUME), _channel),
    "/busmq.v1.ChannelService/SendChannel": Rule(None, cost=_messages),
    "/busmq.v1.ChannelService/SendToRole": Rule(_C, (_PUSH,), _channel, _messages),
    "/busmq.v1.ChannelService/AckChannel": Rule(_C, (_ACK,), _channel),
    "/busmq.v1.ChannelService/DisconnectChannel": TOKEN,
    "/busmq.v1.ChannelService/EndChannel": TOKEN,
    "/busmq.v1.PersistableService/SavePersistable": Rule(_P, (_PUSH,), _name),
    "/busmq.v1.PersistableService/LoadPersistable": Rule(_P, (_CONSUME,), _name),
    "/busmq.v1.PersistableService/RenewPersistable": Rule(_P, (_PUSH,), _name),
    "/busmq.v1.PersistableService/DeletePersistable": Rule(_P, (_ADMIN,), _name),
    "/busmq.v1.RequestService/Call": Rule(_S, (_PUSH,), _service, lambda r: 1),
    "/busmq.v1.RequestService/CallStream": Rule(_S, (_PUSH,), _service, lambda r: 1),
    "/busmq.v1.RequestService/Serve": Rule(_S, (_CONSUME,), _service),
    "/busmq.v1.RequestService/Reply": TOKEN,
}


@dataclass(frozen=True, slots=True)
class Refused:
    """A request read from a client stream that its caller may not make: the stream
    answers it with ``error`` and goes on."""

    request: Any
    error: RequestError


class Unauthenticated(RequestError):
    def __init__(self) -> None:
        super().__init__(
            "missing or invalid credentials", "UNAUTHENTICATED", grpc.StatusCode.UNAUTHENTICATED
        )


class PermissionDenied(RequestError):
    def __init__(self, principal: Principal, kind: Kind, verb: Verb | None, name: str) -> None:
        verb_text = verb.value if verb else "any verb"
        super().__init__(
            f"principal {principal.name!r} may not {verb_text} on {kind.value} {name!r}",
            "PERMISSION_DENIED",
            grpc.StatusCode.PERMISSION_DENIED,
            {"principal": principal.name, "kind": kind.value, "verb": verb_text, "name": name},
        )


class NotTheOwner(RequestError):
    def __init__(self, principal: Principal, token: str) -> None:
        super().__init__(
            f"principal {principal.name!r} may not use a {token} handed to another principal",
            "PERMISSION_DENIED",
            grpc.StatusCode.PERMISSION_DENIED,
            {"principal": principal.name, "token": token},
        )


def caller() -> Principal:
    """The principal of the call being served (the owner of a token it is handed)."""
    return CURRENT.get(ANONYMOUS)


def refuse(error: RequestError, detail: str) -> RequestError:
    """``error``, for the call being served, logged and counted as its principal's
    refusal."""
    access = CURRENT_ACCESS.get(None)
    if access is not None:
        access._refuse(caller(), error.reason, detail)
    return error


def check_owner(owner: str, token: str) -> None:
    """Raise :class:`NotTheOwner` (a refusal) unless the call being served comes from
    ``owner``, the name of the principal the ``token`` (its kind, e.g.
    ``"consumer_id"``; never its value) was handed to."""
    principal = caller()
    if principal.name != owner:
        raise refuse(NotTheOwner(principal, token), f"a {token} of another principal")


class LimitExceeded(RequestError):
    def __init__(self, message: str, reason: str, metadata: dict[str, str]) -> None:
        super().__init__(message, reason, grpc.StatusCode.RESOURCE_EXHAUSTED, metadata)


class RefusalLog:
    """Counts refusals by principal and reason; logs them through a
    :class:`ThrottledLog`, one line per interval and principal."""

    def __init__(self, interval: float = INTERVAL_SECONDS) -> None:
        self.totals: dict[tuple[str, str], int] = {}
        self._log = ThrottledLog(log, interval)

    def refused(self, principal: str, reason: str, detail: str) -> None:
        key = (principal, reason)
        self.totals[key] = self.totals.get(key, 0) + 1
        self._log.log(
            principal, logging.WARNING, "refused a call of principal %s (%s: %s)",
            principal, reason, detail,
        )  # fmt: skip


class _Bucket:
    """A token bucket of ``rate`` tokens per second holding at most one second's worth."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = rate
        self.updated = time.monotonic()

    def take(self, count: int) -> float:
        """Take ``count`` tokens; 0 if there were enough, else the seconds until there
        would be (nothing is taken then)."""
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if count <= self.tokens or self.tokens >= self.rate:
            # A batch larger than a second's worth passes on a full bucket and leaves a
            # debt that later calls wait out: the rate holds over time.
            self.tokens -= count
            return 0.0
        return (min(count, self.rate) - self.tokens) / self.rate


class Access:
    """The gateway's principals, and the checks the guard makes on every call."""

    def __init__(
        self,
        principals: Sequence[Principal],
        *,
        open_access: bool = False,
        mtls: bool = False,
        max_streams: int = 0,
    ) -> None:
        self.principals = tuple(principals)
        self.max_streams = max_streams
        self._open_streams = 0
        self.open_access = open_access
        self.mtls = mtls
        self.refusals = RefusalLog()
        self._by_digest = {_digest(s.encode()): p for p in principals for s in p.secrets}
        self._by_certificate = {
            p.client_certificate: p for p in principals if p.client_certificate is not None
        }
        self._streams: dict[str, int] = {}
        self._buckets = {
            p.name: _Bucket(p.max_pushes_per_second) for p in principals if p.max_pushes_per_second
        }

    # -- authentication ---------------------------------------------------------------

    def identify(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller of ``context``; raises :class:`Unauthenticated`."""
        presented = bearer(context.invocation_metadata())
        if presented:
            principal = self._by_digest.get(_digest(presented))
            if principal is not None:
                return principal
        elif self.mtls and self._by_certificate:
            for identity in certificate_identities(context.auth_context()):
                principal = self._by_certificate.get(identity)
                if principal is not None:
                    return principal
        if self.open_access:
            return ANONYMOUS
        raise Unauthenticated()

    def for_secret(self, presented: bytes) -> Principal | None:
        """The principal whose secret ``presented`` is (HTTP listener)."""
        return self._by_digest.get(_digest(presented)) if presented else None

    # -- authorization ----------------------------------------------------------------

    def check(self, principal: Principal, method: str, request: Any) -> None:
        """Raise :class:`PermissionDenied` or :class:`LimitExceeded` if ``principal``
        may not make this call now (the push rate is spent here when allowed)."""
        rule = RULES.get(method)
        if rule is None:  # a method without a rule: closed until one is written
            raise PermissionDenied(principal, Kind.QUEUE, Verb.ADMIN, method)
        if rule.kind is not None:
            for name in rule.names(request):
                for verb in rule.verbs or (None,):
                    if not principal.may(rule.kind, verb, name):
                        self._refuse(principal, "PERMISSION_DENIED", f"{method} {name!r}")
                        raise PermissionDenied(principal, rule.kind, verb, name)
        bucket = self._buckets.get(principal.name)
        if bucket is not None:
            cost = rule.cost(request)
            wait = bucket.take(cost) if cost else 0.0
            if wait:
                self._refuse(principal, "PUSH_RATE_LIMIT", method)
                raise LimitExceeded(
                    f"principal {principal.name!r} is over its {principal.max_pushes_per_second:g}"
                    " messages/s",
                    "PUSH_RATE_LIMIT",
                    {"principal": principal.name, "retry_after_ms": str(int(wait * 1000) + 1)},
                )

    def visible(self, principal: Principal, kind: Kind, name: str) -> bool:
        """Whether ``principal`` holds any verb on ``name`` (listing filters)."""
        return principal.may(kind, None, name)

    @contextlib.contextmanager
    def stream(self, principal: Principal) -> Iterator[None]:
        """Hold one of ``principal``'s concurrent streams while the block runs."""
        if self.max_streams and self._open_streams >= self.max_streams:
            self._refuse(principal, "GATEWAY_STREAM_LIMIT", f"{self._open_streams} streams open")
            raise LimitExceeded(
                f"the gateway has {self._open_streams} streams open, its limit",
                "GATEWAY_STREAM_LIMIT",
                {"max_streams": str(self.max_streams)},
            )
        open_now = self._streams.get(principal.name, 0)
        if principal.max_streams and open_now >= principal.max_streams:
            self._refuse(principal, "STREAM_LIMIT", f"{open_now} streams open")
            raise LimitExceeded(
                f"principal {principal.name!r} has {open_now} streams open, its limit",
                "STREAM_LIMIT",
                {"principal": principal.name, "max_streams": str(principal.max_streams)},
            )
        self._streams[principal.name] = open_now + 1
        self._open_streams += 1
        try:
            yield
        finally:
            self._streams[principal.name] -= 1
            self._open_streams -= 1

    def streams_of(self, principal: str) -> int:
        return self._streams.get(principal, 0)

    def _refuse(self, principal: Principal, reason: str, detail: str) -> None:
        self.refusals.refused(principal.name, reason, detail)


def bearer(metadata: Sequence[tuple[str, str | bytes]] | None) -> bytes:
    """The secret of an ``authorization: Bearer <secret>`` header (``b""`` if none)."""
    for key, value in metadata or ():
        if key == "authorization":
            raw = value.encode() if isinstance(value, str) else value
            return raw[len(b"Bearer ") :] if raw.startswith(b"Bearer ") else b""
    return b""


def certificate_identities(auth_context: dict[str, list[bytes]]) -> list[str]:
    """The verified client certificate's common name and subject alternative names."""
    names = auth_context.get("x509_common_name", []) + auth_context.get(
        "x509_subject_alternative_name", []
    )
    return [n.decode() for n in names]


def _digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()
