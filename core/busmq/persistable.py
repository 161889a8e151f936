"""Persistables: objects whose tracked fields are saved to and loaded from the bus.

An object is one Redis hash, ``busmq:{name}:o`` (the name as hash tag, like a queue's
keys), one field per tracked field holding its JSON text. It lives on the shard its
name ranks first on (rendezvous hashing), or on the shard that already holds it.

``save()`` writes only the fields whose JSON differs from what was last saved or
loaded (in-place changes to lists and dicts count), with ``HSET`` and ``PEXPIRE`` in one
``MULTI`` round trip. Field-level writes mean that two owners of the same object
changing *different* fields never clobber each other; on the *same* field the last
save wins. A field this owner has never loaded or saved and that still holds its
default is written with ``HSETNX`` (only where the stored object lacks it), and the
stored value is read back in the same ``MULTI``: so two owners creating the same object
at once, each setting one field, keep both fields, whoever saves last.

Every save sets the object's expiry to ``ttl``. ``persist()`` keeps it alive while the
owner runs (a task renews the expiry every third of the ttl); ``unpersist()`` stops
that, so the object expires ``ttl`` seconds later unless someone saves or persists it.

Field tracking, events and the keep-alive live in :class:`PersistableBase`; where the
fields are stored is a :class:`PersistableStore`. :class:`Persistable` stores them in
this bus's Redis; :class:`busmq.federation.FederatedPersistable` stores them through
another datacenter's gateway, with the same API and events.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar

import redis.asyncio as aioredis

from .errors import BusClosedError, BusError, InvalidMessageError
from .events import Event, EventHub
from .keys import PREFIX, validate_name

if TYPE_CHECKING:
    from .context import BusContext
    from .shard import Shard

log = logging.getLogger(__name__)
T = TypeVar("T")


def persistable_key(name: str) -> str:
    """The Redis hash holding persistable ``name`` (same ``{name}`` tag as a queue's keys)."""
    return f"{PREFIX}:{{{name}}}:o"


def _encode(field: str, value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"field {field!r}: value is not a JSON value: {exc}") from None


class PersistableStore(Protocol):
    """Where one persistable's fields are kept: each field is its value's JSON text.

    The object exists from its first write until it expires or is deleted; every
    method but ``write`` leaves a missing object missing.
    """

    async def write(
        self, fields: Mapping[str, str], ttl_ms: int, defaults: Mapping[str, str]
    ) -> dict[str, str]:
        """Write ``fields``, write each of ``defaults`` only where the object lacks that
        field, and set the expiry to ``ttl_ms``, atomically. Returns the text stored
        for each of ``defaults`` after the write (the default, or what was there)."""

    async def read(self, fields: Collection[str]) -> Mapping[str, str | bytes] | None:
        """The stored ones of ``fields`` (``None``: the object does not exist). Values
        may be bytes: text written by another program is decoded as JSON, not here."""

    async def exists(self) -> bool:
        """Whether the object is stored."""

    async def pttl(self) -> int | None:
        """Milliseconds until the object expires (``None``: missing, or no expiry)."""

    async def delete(self) -> None:
        """Remove the object (no error if it is missing)."""

    async def expire(self, ttl_ms: int) -> bool:
        """Set the expiry to ``ttl_ms`` from now; False if the object does not exist."""


class PersistableBase(Mapping[str, Any]):
    """Tracked fields, change detection, events and keep-alive over a
    :class:`PersistableStore`: everything a persistable does except where it is stored.

    Fields are accessed like a mapping: ``obj["count"] += 1``; only the tracked fields
    exist (others raise ``KeyError``) and values must be JSON values (numbers, strings,
    booleans, ``None``, lists and dicts of them), checked on assignment and on save.

    Events (``obj.events``): ``saved`` (``details["fields"]``), ``loaded``
    (``details["existed"]``), ``persisting``, ``unpersisted`` and ``error`` (a failed
    renewal; renewal goes on).

    Args:
        name: the object name (same rules as a queue name).
        fields: the tracked field names, or a mapping of names to default values.
        ttl: seconds the object survives after the last save or renewal.
        store: where the fields are kept.
    """

    def __init__(
        self,
        name: str,
        fields: Iterable[str] | Mapping[str, Any],
        *,
        ttl: float,
        store: PersistableStore,
    ) -> None:
        self.name = validate_name(name)
        defaults = dict(fields) if isinstance(fields, Mapping) else dict.fromkeys(fields)
        if isinstance(fields, str) or not defaults:
            raise ValueError("fields must name at least one field (an iterable of str)")
        for field in defaults:
            if not isinstance(field, str) or not field:
                raise ValueError(f"field names must be non-empty strings, got {field!r}")
        _check_ttl(ttl)
        self.ttl = ttl
        self.events: EventHub[Event] = EventHub()
        self._store = store
        # Copies through JSON: defaults are validated, and never shared between objects.
        self._defaults = {f: _encode(f, v) for f, v in defaults.items()}
        self._values: dict[str, Any] = {f: json.loads(t) for f, t in self._defaults.items()}
        self._saved: dict[str, str] = {}
        self._renewer: asyncio.Task[None] | None = None
        # Set to renew before the next third of the ttl is up (e.g. a link came back).
        self._renew_now = asyncio.Event()

    def __repr__(self) -> str:
        kind, fields = type(self).__name__, list(self._values)
        return f"<{kind} {self.name!r} fields={fields} persisted={self.persisted}>"

    # -- fields -----------------------------------------------------------------------

    def __getitem__(self, field: str) -> Any:
        try:
            return self._values[field]
        except KeyError:
            raise KeyError(f"{field!r} is not a tracked field of {self.name!r}") from None

    def __setitem__(self, field: str, value: Any) -> None:
        if field not in self._values:
            raise KeyError(f"{field!r} is not a tracked field of {self.name!r}")
        _encode(field, value)
        self._values[field] = value

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def update(self, values: Mapping[str, Any]) -> None:
        """Set several fields; nothing is set if any name or value is refused."""
        for field, value in values.items():
            if field not in self._values:
                raise KeyError(f"{field!r} is not a tracked field of {self.name!r}")
            _encode(field, value)
        self._values.update(values)

    @property
    def changed(self) -> frozenset[str]:
        """The fields that differ from what was last saved or loaded (all of them before
        the first save or successful load)."""
        return frozenset(self._changes())

    def _changes(self) -> dict[str, str]:
        encoded = {f: _encode(f, v) for f, v in self._values.items()}
        return {f: text for f, text in encoded.items() if self._saved.get(f) != text}

    # -- saving and loading ------------------------------------------------------------

    async def save(self) -> list[str]:
        """Write the changed fields and refresh the expiry, in one round trip.

        Returns the names of the fields written (none: nothing was sent). A field never
        loaded or saved by this owner that still holds its default is written only where
        the stored object lacks it; where another owner stored it, that value is kept and
        becomes the local one. If the write fails, the fields still count as changed, so
        the next ``save()`` sends them.

        Raises:
            InvalidMessageError: a field holds a value that is not JSON (nothing written).
        """
        changes = self._changes()
        if not changes:
            return []
        defaults = {
            f: text
            for f, text in changes.items()
            if f not in self._saved and text == self._defaults[f]
        }
        fields = {f: text for f, text in changes.items() if f not in defaults}
        stored = await self._store.write(fields, _ms(self.ttl), defaults)
        self._saved.update(fields)
        for field, text in stored.items():
            if field in defaults and text != defaults[field]:
                try:
                    self._values[field] = json.loads(text)
                except ValueError:  # written by another program: left to the next load()
                    continue
            self._saved[field] = text
        written = sorted(changes)
        self.events.emit(Event("saved", self.name, details={"fields": written}))
        return written

    async def load(self) -> bool:
        """Read every tracked field; returns whether the object existed.

        Fields stored replace the local values. Tracked fields the stored object lacks
        (or every field, if it does not exist) keep their local values and count as
        changed, so the next ``save()`` writes them.

        Raises:
            InvalidMessageError: a stored field is not valid JSON (written by another
                program); nothing was changed locally.
        """
        raw = await self._store.read(tuple(self._values))
        loaded: dict[str, Any] = {}
        for field, text in (raw or {}).items():
            if field not in self._values:
                continue
            try:
                loaded[field] = json.loads(text)
            except ValueError:
                raise InvalidMessageError(
                    f"field {field!r} of {self.name!r} holds invalid JSON in Redis"
                ) from None
        self._values.update(loaded)
        self._saved = {f: _encode(f, v) for f, v in loaded.items()}
        existed = raw is not None
        self.events.emit(Event("loaded", self.name, details={"existed": existed}))
        return existed

    async def exists(self) -> bool:
        """Whether the object is stored (saved and not expired or deleted)."""
        return await self._store.exists()

    async def remaining_ttl(self) -> float | None:
        """Seconds until the object expires, or ``None`` if it is not stored."""
        pttl = await self._store.pttl()
        return None if pttl is None else pttl / 1000

    async def delete(self) -> None:
        """Stop renewing and remove the stored object (local values are kept and all
        count as changed)."""
        await self._stop_renewing()
        await self._store.delete()
        self._saved.clear()

    # -- keep-alive ---------------------------------------------------------------------

    @property
    def persisted(self) -> bool:
        """Whether the expiry is being renewed (between ``persist`` and ``unpersist``)."""
        return self._renewer is not None

    async def persist(self, ttl: float | None = None) -> None:
        """Keep the object alive while this owner runs: renew its expiry every third of
        ``ttl`` (which becomes the object's ``ttl``; default: the current one).

        Renewal does not create the object: save it once for it to exist.
        """
        if ttl is not None:
            _check_ttl(ttl)
            self.ttl = ttl
        await self._stop_renewing()
        await self._refresh()
        self._renew_now.clear()
        self._renewer = asyncio.create_task(
            self._renew_loop(), name=f"busmq-persistable {self.name}"
        )
        self.events.emit(Event("persisting", self.name, details={"ttl": self.ttl}))

    async def touch(self) -> bool:
        """Set the expiry to ``ttl`` from now, once, without writing fields (what
        ``persist()`` does every third of the ttl); returns whether the object exists
        (a missing object is not created)."""
        return await self._store.expire(_ms(self.ttl))

    async def unpersist(self) -> None:
        """Stop renewing: the object expires ``ttl`` seconds from now (unless it is
        saved or persisted again)."""
        if self._renewer is None:
            return
        await self._stop_renewing()
        await self._refresh()
        self.events.emit(Event("unpersisted", self.name, details={"ttl": self.ttl}))

    async def close(self) -> None:
        """``unpersist()``; the object stays stored until it expires."""
        await self.unpersist()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _refresh(self) -> None:
        await self._store.expire(_ms(self.ttl))

    async def _renew_loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.ttl / 3):
                    await self._renew_now.wait()
            except TimeoutError:
                pass
            self._renew_now.clear()
            try:
                await self._refresh()
            except BusClosedError:
                return
            except BusError as exc:
                log.warning("keep-alive of persistable %s failed: %s", self.name, exc)
                self.events.emit(Event("error", self.name, error=exc))

    async def _stop_renewing(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)


class Persistable(PersistableBase):
    """An object with tracked fields, saved on the bus. Lead API: ``bus.persistable(...)``.

    Fields are accessed like a mapping: ``obj["count"] += 1``; only the tracked fields
    exist (others raise ``KeyError``) and values must be JSON values (numbers, strings,
    booleans, ``None``, lists and dicts of them), checked on assignment and on save.

    Events (``obj.events``): ``saved`` (``details["fields"]``), ``loaded``
    (``details["existed"]``), ``persisting``, ``unpersisted`` and ``error`` (a failed
    renewal; renewal goes on).

    Args:
        bus: a connected bus.
        name: the object name (same rules as a queue name).
        fields: the tracked field names, or a mapping of names to default values.
        ttl: seconds the object survives after the last save or renewal (default
            ``BusSettings.default_ttl``).
    """

    def __init__(
        self,
        bus: BusContext,
        name: str,
        fields: Iterable[str] | Mapping[str, Any],
        *,
        ttl: float | None = None,
    ) -> None:
        store = RedisStore(bus, validate_name(name))
        ttl = bus.settings.default_ttl if ttl is None else ttl
        super().__init__(name, fields, ttl=ttl, store=store)
        self._bus = bus
        self._key = store.key


class RedisStore:
    """A persistable in this bus's Redis: the hash ``busmq:{name}:o`` on the shard that
    holds it (located on first use)."""

    def __init__(self, bus: BusContext, name: str) -> None:
        self.name = name
        self.key = persistable_key(name)
        self._bus = bus
        self._shard: Shard | None = None

    async def write(
        self, fields: Mapping[str, str], ttl_ms: int, defaults: Mapping[str, str]
    ) -> dict[str, str]:
        async def write(client: aioredis.Redis) -> list[Any]:
            pipe = client.pipeline(transaction=True)
            if fields:
                pipe.hset(self.key, mapping=dict(fields))  # type: ignore[arg-type]
            for field, text in defaults.items():
                pipe.hsetnx(self.key, field, text)
            pipe.pexpire(self.key, ttl_ms)
            if defaults:
                pipe.hmget(self.key, list(defaults))
            return await pipe.execute()

        replies = await self._run(write)
        if not defaults:
            return {}
        stored: list[bytes | None] = replies[-1]
        return {
            field: text if value is None else value.decode("utf-8", "replace")
            for (field, text), value in zip(defaults.items(), stored, strict=True)
        }

    async def read(self, fields: Collection[str]) -> dict[str, str | bytes] | None:
        raw: dict[bytes, bytes] = await self._run(
            lambda c: c.hgetall(self.key)  # type: ignore[arg-type,return-value]
        )
        if not raw:
            return None
        return {f: raw[f.encode()] for f in fields if f.encode() in raw}

    async def exists(self) -> bool:
        return bool(await self._run(lambda c: c.exists(self.key)))

    async def pttl(self) -> int | None:
        pttl = int(await self._run(lambda c: c.pttl(self.key)))
        return None if pttl < 0 else pttl

    async def delete(self) -> None:
        await self._run(lambda c: c.delete(self.key))

    async def expire(self, ttl_ms: int) -> bool:
        return bool(await self._run(lambda c: c.pexpire(self.key, ttl_ms)))

    async def _run(self, call: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        if self._bus.closed:
            raise BusClosedError("the bus is closed")
        if self._shard is None:
            self._shard = await self._bus.placement.locate(self.name, self.key)
        return await self._shard.run(call, idempotent=True)


def _check_ttl(ttl: float) -> None:
    if not isinstance(ttl, int | float) or ttl <= 0 or _ms(ttl) < 1:
        raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
