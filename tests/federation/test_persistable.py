"""A federated persistable has the persistable API and events; its fields live in DC-A."""

from __future__ import annotations

import asyncio

import pytest

from busmq import Bus, BusUnavailableError, Event, Persistable
from busmq.federation import FederatedPersistable, FederationUnauthorizedError, LinkState
from tests.federation.conftest import DatacenterA, MakeB
from tests.support.waiting import eventually


async def test_a_save_in_b_loads_in_a_and_a_save_in_a_loads_in_b(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = dc_b.federate(dc_b.persistable("profile", {"name": "ann", "visits": 0}), dc_a.url)
    assert isinstance(remote, FederatedPersistable)
    events: list[Event] = []
    remote.events.on(events.append)
    assert remote.changed == {"name", "visits"}
    assert await remote.save() == ["name", "visits"]
    assert remote.changed == set() and await remote.save() == []

    local = dc_a.bus.persistable("profile", ["name", "visits", "absent"])
    assert await local.load()
    assert dict(local) == {"name": "ann", "visits": 0, "absent": None}
    local["visits"] = 5
    local["name"] = {"first": "ann", "tags": ["x"]}
    await local.save()

    assert await remote.load() is True
    assert dict(remote) == {"name": {"first": "ann", "tags": ["x"]}, "visits": 5}
    assert remote.changed == set()
    remote["name"]["tags"].append("y")  # in place, as locally
    assert remote.changed == {"name"}

    saved = [e for e in events if e.kind == "saved"]
    assert [(e.source, e.details["fields"]) for e in saved] == [("profile", ["name", "visits"])]
    loaded = [e for e in events if e.kind == "loaded"]
    assert [(e.source, e.details["existed"]) for e in loaded] == [("profile", True)]


async def test_only_changed_fields_travel_so_a_concurrent_writer_in_a_is_not_clobbered(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = dc_b.federate(dc_b.persistable("shared", {"a": 0, "b": 0}, ttl=60), dc_a.url)
    await remote.save()
    local = dc_a.bus.persistable("shared", {"a": 0, "b": 0})
    await local.load()
    remote["a"] = 1
    local["b"] = 2
    assert list(await asyncio.gather(remote.save(), local.save())) == [["a"], ["b"]]

    reader = dc_a.bus.persistable("shared", ["a", "b"])
    assert await reader.load()
    assert dict(reader) == {"a": 1, "b": 2}
    assert await remote.load() and dict(remote) == {"a": 1, "b": 2}


async def test_a_first_save_in_b_keeps_a_field_a_new_object_got_in_a_meanwhile(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = dc_b.federate(dc_b.persistable("fresh", {"visits": 0, "name": None}), dc_a.url)
    assert await remote.load() is False
    local = dc_a.bus.persistable("fresh", {"visits": 0, "name": None})
    local["visits"] = 5
    await local.save()
    remote["name"] = "ada"
    assert await remote.save() == ["name", "visits"]
    assert dict(remote) == {"visits": 5, "name": "ada"}

    assert await local.load() and dict(local) == {"visits": 5, "name": "ada"}


async def test_exists_remaining_ttl_touch_and_delete_act_on_the_object_in_a(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = dc_b.federate(dc_b.persistable("config", {"level": 1}, ttl=60), dc_a.url)
    local = dc_a.bus.persistable("config", ["level"])
    assert not await remote.exists() and await remote.remaining_ttl() is None
    assert await remote.touch() is False  # a missing object is not created
    assert await remote.load() is False and remote["level"] == 1
    assert not await local.exists()

    await remote.save()
    assert await remote.exists() and await local.exists()
    remaining = await remote.remaining_ttl()
    assert remaining is not None and 55 < remaining <= 60
    remote.ttl = 120
    assert await remote.touch() is True
    remaining = await local.remaining_ttl()
    assert remaining is not None and 115 < remaining <= 120

    await remote.delete()
    assert not await remote.exists() and not await local.exists()
    assert remote.changed == {"level"}
    await remote.delete()  # already gone: no error
    assert await remote.save() == ["level"]
    assert await local.load() and local["level"] == 1


async def test_persist_keeps_a_short_lived_object_alive_and_unpersist_lets_it_expire(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = dc_b.federate(dc_b.persistable("session", {"user": "ada"}, ttl=1.2), dc_a.url)
    local = dc_a.bus.persistable("session", ["user"])
    kinds: list[str] = []
    remote.events.on(lambda event: kinds.append(event.kind))
    async with remote:
        await remote.save()
        await remote.persist()
        assert remote.persisted
        loop = asyncio.get_running_loop()
        until = loop.time() + 2.6  # the observation window: over two ttls
        while loop.time() < until:
            assert await local.exists()
            await asyncio.sleep(0.1)  # the poll interval of the observation window
    assert not remote.persisted  # leaving the block unpersisted it
    remaining = await local.remaining_ttl()
    assert remaining is not None and 0 < remaining <= 1.2
    await eventually(lambda: _gone(local), timeout=5, what="expiry after unpersist")
    assert "persisting" in kinds and "unpersisted" in kinds and "error" not in kinds

    assert await remote.load() is False  # expired: every field counts as changed again
    assert await remote.save() == ["user"]
    await remote.persist(ttl=30)
    await dc_b.close()  # the bus stops the renewal, and leaves the object to its ttl
    assert not remote.persisted
    remaining = await local.remaining_ttl()
    assert remaining is not None and 25 < remaining <= 30


async def _gone(obj: Persistable) -> bool:
    return not await obj.exists()


async def test_a_save_while_cut_fails_fast_stores_nothing_and_renewal_resumes_on_ready(
    dc_a: DatacenterA, dc_b: Bus
) -> None:
    remote = dc_b.federate(dc_b.persistable("profile", {"name": "ann", "visits": 0}), dc_a.url)
    session = dc_b.federate(dc_b.persistable("session", {"user": "ada"}, ttl=1.5), dc_a.url)
    local = dc_a.bus.persistable("profile", ["name", "visits"])
    events: list[Event] = []
    remote.events.on(events.append)
    session_errors: list[Event] = []
    session.events.on(lambda e: session_errors.append(e) if e.kind == "error" else None)
    await remote.save()
    await remote.persist(ttl=30)
    await session.save()
    await session.persist()

    await dc_a.proxy.cut()
    remote.update({"name": "bob", "visits": 1})
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(BusUnavailableError):
        await remote.save()
    assert loop.time() - started < 2
    assert remote.changed == {"name", "visits"}  # still to be saved
    await eventually(lambda: remote.state is LinkState.DISCONNECTED, what="link down")
    with pytest.raises(BusUnavailableError):
        await remote.load()
    assert await local.load() and dict(local) == {"name": "ann", "visits": 0}
    await eventually(lambda: bool(session_errors), what="a failed renewal reported")
    assert isinstance(session_errors[0].error, BusUnavailableError)
    assert session.persisted  # renewal goes on
    # Wait until the last renewal (at persist) is visibly old, so that a renewal
    # made on ready is told apart from the next periodic one (due 10 s after it).
    await eventually(lambda: _ttl_below(local, 29), what="the ttl running down")

    await dc_a.proxy.restore()
    await eventually(lambda: _ttl_above(local, 29.5), timeout=5, what="renewed on ready")
    assert ("ready", dc_a.url) in [(e.kind, e.source) for e in events]
    assert "state" in [e.kind for e in events]
    assert await remote.save() == ["name", "visits"]
    assert await local.load() and dict(local) == {"name": "bob", "visits": 1}
    assert session.persisted


async def _ttl_below(obj: Persistable, limit: float) -> bool:
    remaining = await obj.remaining_ttl()
    return remaining is not None and remaining < limit


async def _ttl_above(obj: Persistable, limit: float) -> bool:
    remaining = await obj.remaining_ttl()
    return remaining is not None and remaining > limit


async def test_a_wrong_secret_is_refused_as_unauthorized(dc_a: DatacenterA, make_b: MakeB) -> None:
    bus = await make_b(secret="wrong")
    remote = bus.federate(bus.persistable("profile", {"name": "eve"}), dc_a.url)
    kinds: list[str] = []
    remote.events.on(lambda event: kinds.append(event.kind))
    with pytest.raises(FederationUnauthorizedError):
        await remote.save()
    assert remote.state is LinkState.UNAUTHORIZED
    with pytest.raises(FederationUnauthorizedError):
        await remote.load()
    with pytest.raises(FederationUnauthorizedError):
        await remote.persist()
    assert not remote.persisted
    assert kinds.count("unauthorized") == 1
    assert not await dc_a.bus.persistable("profile", ["name"]).exists()
