"""PersistableService through the generated stub, against core persistables on real Redis."""

from __future__ import annotations

import json

import grpc
import pytest
from google.protobuf import duration_pb2

from busmq import Bus
from busmq.v1 import persistable_service_pb2 as pb
from tests.gateway.conftest import AUTH, GatewayUnderTest, error_info


async def save(gw: GatewayUnderTest, name: str, ttl: int = 0, **fields: object) -> None:
    request = pb.SavePersistableRequest(
        name=name, fields={k: json.dumps(v) for k, v in fields.items()}
    )
    if ttl:
        request.ttl.seconds = ttl
    await gw.persistables.SavePersistable(request, metadata=AUTH)


async def load(gw: GatewayUnderTest, name: str, *fields: str) -> pb.LoadPersistableResponse:
    response: pb.LoadPersistableResponse = await gw.persistables.LoadPersistable(
        pb.LoadPersistableRequest(name=name, fields=fields), metadata=AUTH
    )
    return response


async def test_a_save_writes_exactly_the_fields_sent_and_load_reads_them_back(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    profile = peer_bus.persistable("user:7", {"visits": 0, "name": None, "tags": []})
    profile.update({"name": "ann", "tags": ["a"]})
    await profile.save()
    # Over gRPC, one changed field: the others, saved by the core owner, are untouched.
    await save(gateway, "user:7", visits=5)
    assert await profile.load()
    assert dict(profile) == {"visits": 5, "name": "ann", "tags": ["a"]}

    loaded = await load(gateway, "user:7", "visits", "tags", "absent")
    assert loaded.exists
    assert {k: json.loads(v) for k, v in loaded.fields.items()} == {"visits": 5, "tags": ["a"]}
    assert 0 < loaded.ttl.seconds <= 30

    missing = await load(gateway, "user:8", "visits")
    assert not missing.exists and not missing.fields and not missing.HasField("ttl")


async def test_defaults_are_written_only_where_the_object_lacks_them(
    gateway: GatewayUnderTest,
) -> None:
    await save(gateway, "user:9", visits=5)
    request = pb.SavePersistableRequest(
        name="user:9", fields={"name": '"ada"'}, defaults={"visits": "0", "tags": "[]"}
    )
    response = await gateway.persistables.SavePersistable(request, metadata=AUTH)
    assert dict(response.defaults) == {"visits": "5", "tags": "[]"}  # what is stored now
    loaded = await load(gateway, "user:9", "visits", "name", "tags")
    stored = {k: json.loads(v) for k, v in loaded.fields.items()}
    assert stored == {"visits": 5, "name": "ada", "tags": []}


async def test_ttl_on_save_and_renew_keep_an_object_alive(gateway: GatewayUnderTest) -> None:
    await save(gateway, "session", ttl=60, token="abc")
    assert 50 < (await load(gateway, "session", "token")).ttl.seconds <= 60
    await gateway.persistables.RenewPersistable(
        pb.RenewPersistableRequest(name="session", ttl=duration_pb2.Duration(seconds=600)),
        metadata=AUTH,
    )
    renewed = await load(gateway, "session", "token")
    assert 590 < renewed.ttl.seconds <= 600 and json.loads(renewed.fields["token"]) == "abc"
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await gateway.persistables.RenewPersistable(
            pb.RenewPersistableRequest(name="no-such-object"), metadata=AUTH
        )
    assert error.value.code() is grpc.StatusCode.NOT_FOUND
    assert error_info(error.value).reason == "PERSISTABLE_NOT_FOUND"


async def test_delete_removes_the_object_for_every_client_and_a_missing_one_is_fine(
    gateway: GatewayUnderTest, peer_bus: Bus
) -> None:
    profile = peer_bus.persistable("user:9", {"visits": 3})
    await profile.save()
    await save(gateway, "user:9", other=1)
    await gateway.persistables.DeletePersistable(
        pb.DeletePersistableRequest(name="user:9"), metadata=AUTH
    )
    assert not await profile.exists()
    assert not (await load(gateway, "user:9", "visits", "other")).exists
    await gateway.persistables.DeletePersistable(
        pb.DeletePersistableRequest(name="user:9"), metadata=AUTH
    )
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await gateway.persistables.DeletePersistable(pb.DeletePersistableRequest(name="user:9"))
    assert error.value.code() is grpc.StatusCode.UNAUTHENTICATED
