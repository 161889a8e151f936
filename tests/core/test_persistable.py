from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from busmq import Bus, InvalidMessageError, InvalidNameError
from busmq.persistable import Persistable, persistable_key
from tests.support.redis_server import RedisServer
from tests.support.waiting import eventually


async def test_a_second_save_writes_exactly_the_changed_field(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    bus: Bus = await make_bus([redis_server.url])
    profile = Persistable(bus, "profile", {"name": "ada", "visits": 0, "tags": []})
    assert await profile.save() == ["name", "tags", "visits"]
    profile["visits"] += 1
    assert profile.changed == {"visits"}

    commands: list[str] = []
    watcher = redis_server.client()
    async with watcher.monitor() as monitor:
        listening = asyncio.create_task(_record(monitor, commands))
        await asyncio.sleep(0)  # let the monitor task send MONITOR first
        assert await profile.save() == ["visits"]
        await eventually(lambda: any("EXEC" in c for c in commands), what="EXEC seen")
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
    await watcher.aclose()
    writes = [c for c in commands if c.startswith(("HSET", "HMSET", "MULTI", "PEXPIRE", "EXEC"))]
    key = persistable_key("profile")
    assert writes == ["MULTI", f"HSET {key} visits 1", f"PEXPIRE {key} 30000", "EXEC"]
    assert await profile.save() == []  # nothing changed: nothing sent


async def _record(monitor: Any, commands: list[str]) -> None:
    async for entry in monitor.listen():
        commands.append(entry["command"])


async def test_load_of_a_missing_object_says_so_and_keeps_local_values(bus: Bus) -> None:
    ghost = Persistable(bus, "ghost", {"x": 1})
    assert await ghost.load() is False
    assert ghost["x"] == 1
    assert ghost.changed == {"x"}
    assert not await ghost.exists()


async def test_load_reads_every_field_back_and_in_place_changes_count(bus: Bus) -> None:
    writer = Persistable(bus, "cart", ["items", "total", "note"])
    writer.update({"items": [{"sku": "a", "qty": 2}], "total": 9.5})
    await writer.save()
    reader = Persistable(bus, "cart", {"items": [], "total": 0, "note": "local"})
    assert await reader.load() is True
    assert dict(reader) == {"items": [{"sku": "a", "qty": 2}], "total": 9.5, "note": None}
    assert reader.changed == set()
    reader["items"].append({"sku": "b", "qty": 1})  # mutated in place, not reassigned
    assert reader.changed == {"items"}
    assert await reader.save() == ["items"]
    await writer.load()
    assert writer["items"] == [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 1}]


async def test_writers_of_different_fields_never_clobber_each_other(bus: Bus) -> None:
    first = Persistable(bus, "shared", {"a": 0, "b": 0})
    second = Persistable(bus, "shared", {"a": 0, "b": 0})
    await first.save()
    await second.load()
    first["a"] = 1
    second["b"] = 2
    await asyncio.gather(first.save(), second.save())
    third = Persistable(bus, "shared", ["a", "b"])
    assert await third.load()
    assert dict(third) == {"a": 1, "b": 2}


async def test_owners_creating_one_object_at_once_keep_each_others_fields(bus: Bus) -> None:
    first = Persistable(bus, "new-user", {"visits": 0, "name": None})
    second = Persistable(bus, "new-user", {"visits": 0, "name": None})
    assert await first.load() is False and await second.load() is False
    first["visits"] = 5
    second["name"] = "ada"
    assert await first.save() == ["name", "visits"]
    # The second save's untouched default of "visits" must not overwrite the 5.
    assert await second.save() == ["name", "visits"]
    assert dict(second) == {"visits": 5, "name": "ada"}  # the stored value is adopted
    assert second.changed == set()

    reader = Persistable(bus, "new-user", ["visits", "name"])
    assert await reader.load()
    assert dict(reader) == {"visits": 5, "name": "ada"}
    assert await first.load() and dict(first) == {"visits": 5, "name": "ada"}


async def test_concurrent_first_saves_of_different_fields_both_land(bus: Bus) -> None:
    owners = [Persistable(bus, "race", {"a": 0, "b": 0, "c": 0}) for _ in range(3)]
    for owner, field in zip(owners, "abc", strict=True):
        owner[field] = 1
    await asyncio.gather(*(o.save() for o in owners))
    reader = Persistable(bus, "race", ["a", "b", "c"])
    assert await reader.load()
    assert dict(reader) == {"a": 1, "b": 1, "c": 1}


async def test_setting_a_loaded_field_back_to_its_default_is_written(bus: Bus) -> None:
    writer = Persistable(bus, "counter", {"n": 0})
    writer["n"] = 3
    await writer.save()
    resetter = Persistable(bus, "counter", {"n": 0})
    assert await resetter.load() and resetter["n"] == 3
    resetter["n"] = 0  # a field it has read: an explicit reset, not a default
    assert await resetter.save() == ["n"]
    assert await writer.load() and writer["n"] == 0


async def test_keep_alive_holds_while_persisted_and_the_object_expires_after_unpersist(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    bus: Bus = await make_bus([redis_server.url])
    session = Persistable(bus, "session", {"user": "ada"}, ttl=1.2)
    await session.save()
    await session.persist()
    assert session.persisted
    loop = asyncio.get_running_loop()
    until = loop.time() + 2.6  # over two ttls: it would have expired without renewal
    while loop.time() < until:
        assert await session.exists()
        await asyncio.sleep(0.1)  # the poll interval of the observation window
    await session.unpersist()
    assert not session.persisted
    remaining = await session.remaining_ttl()
    assert remaining is not None and 0 < remaining <= 1.2
    await eventually(lambda: _gone(session), timeout=5, what="expiry after unpersist")


async def _gone(obj: Persistable) -> bool:
    return not await obj.exists()


async def test_persist_with_a_new_ttl_applies_it_to_later_saves(bus: Bus) -> None:
    async with Persistable(bus, "config", {"level": 1}) as config:
        await config.persist(ttl=120)
        config["level"] = 2
        await config.save()
        remaining = await config.remaining_ttl()
        assert remaining is not None and remaining > 100
    assert not config.persisted
    await config.delete()
    assert await config.load() is False


# -- bad input ---------------------------------------------------------------------------


async def test_non_json_values_and_untracked_fields_are_refused(bus: Bus) -> None:
    obj = Persistable(bus, "strict", {"value": None})
    for bad in (object(), {1, 2}, float("nan"), b"bytes"):
        with pytest.raises(InvalidMessageError):
            obj["value"] = bad
    with pytest.raises(ValueError):  # InvalidMessageError is a ValueError
        obj["value"] = {"nested": object()}
    with pytest.raises(KeyError):
        obj["other"] = 1
    with pytest.raises(KeyError):
        obj.update({"value": 1, "other": 2})
    assert obj["value"] is None  # the refused update set nothing
    items: list[Any] = []
    obj["value"] = items
    items.append(object())  # slipped in by mutation: caught at save
    with pytest.raises(InvalidMessageError):
        await obj.save()
    assert not await obj.exists()


async def test_invalid_names_fields_and_ttls_are_refused(bus: Bus) -> None:
    with pytest.raises(InvalidNameError):
        Persistable(bus, "no spaces", ["a"])
    with pytest.raises(InvalidMessageError):
        Persistable(bus, "ok", {"a": object()})
    for fields in ([], "abc", [""]):
        with pytest.raises(ValueError):
            Persistable(bus, "ok", fields)
    with pytest.raises(ValueError):
        Persistable(bus, "ok", ["a"], ttl=0)
    with pytest.raises(ValueError):
        await Persistable(bus, "ok", ["a"]).persist(ttl=-1)


async def test_a_field_holding_invalid_json_in_redis_is_reported(
    redis_server: RedisServer, make_bus: Callable[..., Any]
) -> None:
    bus: Bus = await make_bus([redis_server.url])
    raw = redis_server.client()
    await raw.hset(persistable_key("foreign"), mapping={"a": "not json"})
    await raw.aclose()
    obj = Persistable(bus, "foreign", {"a": 1})
    with pytest.raises(InvalidMessageError, match="invalid JSON"):
        await obj.load()
    assert obj["a"] == 1
