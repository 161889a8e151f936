"""Refusal tables on the servicer tier (moved from the socket tests, which keep the
paths): each bad request ends with its code and ErrorInfo reason, and nothing of it is
stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from busmq.v1 import channel_service_pb2 as cpb
from busmq.v1 import persistable_service_pb2 as ppb
from busmq.v1 import queue_service_pb2 as pb
from busmq.v1 import request_service_pb2 as rpb
from busmq.v1 import types_pb2
from tests.gateway.servicers import (
    JSON,
    SECRET,
    TEXT,
    Servicers,
    call,
    in_process,
    json_message,
    refused_as_invalid,
    text,
    unary,
)
from tests.support.redis_server import RedisServer


@pytest.fixture
async def servicers(redis_server: RedisServer) -> AsyncIterator[Servicers]:
    async with in_process(redis_server, secrets=(SECRET,)) as found:
        yield found


@pytest.mark.parametrize(
    ("request_", "code", "reason"),
    [
        (
            pb.PushRequest(queue="bad name", messages=[text("x")]),
            "INVALID_ARGUMENT",
            "INVALID_NAME",
        ),
        (pb.PushRequest(queue="missing", messages=[text("x")]), "NOT_FOUND", "QUEUE_NOT_FOUND"),
        (pb.PushRequest(queue="present", messages=[]), "INVALID_ARGUMENT", "INVALID_ARGUMENT"),
        (
            pb.PushRequest(
                queue="present", messages=[types_pb2.OutgoingMessage(payload=b"{", kind=JSON)]
            ),
            "INVALID_ARGUMENT",
            "INVALID_MESSAGE",
        ),
        (
            pb.PushRequest(
                queue="present", messages=[types_pb2.OutgoingMessage(payload=b"\xff", kind=TEXT)]
            ),
            "INVALID_ARGUMENT",
            "INVALID_MESSAGE",
        ),
        (
            pb.PushRequest(
                queue="present", messages=[types_pb2.OutgoingMessage(payload=b"x" * 70_000)]
            ),
            "RESOURCE_EXHAUSTED",
            "MESSAGE_TOO_LARGE",
        ),
        (
            pb.PushRequest(queue="present", messages=[text("x")], producer_sequence=3),
            "INVALID_ARGUMENT",
            "INVALID_ARGUMENT",
        ),
        (
            pb.PushRequest(queue="present", messages=[text("x")], producer="bad name"),
            "INVALID_ARGUMENT",
            "INVALID_NAME",
        ),
        (
            pb.PushRequest(
                queue="present", messages=[text("x")], producer="etl", producer_sequence=2**60
            ),
            "INVALID_ARGUMENT",
            "INVALID_ARGUMENT",
        ),
    ],
)
async def test_bad_pushes_get_clear_statuses_and_nothing_is_stored(
    servicers: Servicers, request_: pb.PushRequest, code: str, reason: str
) -> None:
    """(Moved here from the socket tests: a status mapping, no path.)"""
    ttl = duration_pb2.Duration(seconds=60)
    await unary(servicers, "AttachQueue", pb.AttachQueueRequest(queue="present", ttl=ttl))
    kept = pb.PushRequest(queue="present", messages=[text("kept")])
    assert (await unary(servicers, "Push", kept)).code is grpc.StatusCode.OK
    done = await unary(servicers, "Push", request_)
    assert done.code.name == code, done.details
    assert done.reason()[0] == reason
    info = await unary(servicers, "GetQueue", pb.GetQueueRequest(queue="present"))
    assert info.response.count == 1  # what was accepted before is still there


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (ppb.SavePersistableRequest(name="bad name", fields={"a": "1"}), "INVALID_NAME"),
        (ppb.SavePersistableRequest(name="obj", fields={"a": "not json"}), "INVALID_MESSAGE"),
        (ppb.SavePersistableRequest(name="obj", fields={"a": "NaN"}), "INVALID_MESSAGE"),
        (ppb.SavePersistableRequest(name="obj", fields={}), "INVALID_ARGUMENT"),
        (ppb.SavePersistableRequest(name="obj", fields={"": "1"}), "INVALID_ARGUMENT"),
        (ppb.SavePersistableRequest(name="obj", defaults={"a": "Infinity"}), "INVALID_MESSAGE"),
        (
            ppb.SavePersistableRequest(name="obj", fields={"a": "1"}, defaults={"a": "2"}),
            "INVALID_ARGUMENT",
        ),
        (
            ppb.SavePersistableRequest(
                name="obj", fields={"a": "1"}, ttl=duration_pb2.Duration(seconds=-5)
            ),
            "INVALID_ARGUMENT",
        ),
        (ppb.LoadPersistableRequest(name="obj"), "INVALID_ARGUMENT"),
        (ppb.LoadPersistableRequest(name="{obj}", fields=["a"]), "INVALID_NAME"),
        (ppb.RenewPersistableRequest(name=""), "INVALID_NAME"),
        (ppb.DeletePersistableRequest(name="bad name"), "INVALID_NAME"),
    ],
)
async def test_bad_persistable_requests_are_refused_and_nothing_is_written(
    servicers: Servicers, request_: Any, reason: str
) -> None:
    """(Moved here from the socket tests: a status mapping, no path.)"""
    await refused_as_invalid(servicers, "PersistableService", request_, reason)
    load = ppb.LoadPersistableRequest(name="obj", fields=["a"])
    assert not (
        await call(servicers, "PersistableService", "LoadPersistable", load)
    ).response.exists


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (rpb.CallRequest(service="bad name", request=json_message(1)), "INVALID_NAME"),
        (
            rpb.CallRequest(service="s", request=json_message(1, **{"busmq-x": "1"})),
            "INVALID_MESSAGE",
        ),
        (
            rpb.CallRequest(
                service="s", request=types_pb2.OutgoingMessage(payload=b"{", kind=JSON)
            ),
            "INVALID_MESSAGE",
        ),
        (
            rpb.CallRequest(
                service="s", request=json_message(1), timeout=duration_pb2.Duration(seconds=-1)
            ),
            "INVALID_ARGUMENT",
        ),
        (rpb.CallStreamRequest(service="", request=json_message(1)), "INVALID_NAME"),
        (rpb.ServeRequest(service="bad name"), "INVALID_NAME"),
        (rpb.ServeRequest(service="s", concurrency=100_000), "INVALID_ARGUMENT"),
    ],
)
async def test_bad_request_service_requests_are_refused(
    servicers: Servicers, request_: Any, reason: str
) -> None:
    """(Moved here from the socket tests: a status mapping, no path.)"""
    await refused_as_invalid(servicers, "RequestService", request_, reason)


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (cpb.ConnectChannelRequest(channel="bad name"), "INVALID_NAME"),
        (cpb.ConnectChannelRequest(channel="c", local_role="a:b"), "INVALID_NAME"),
        (
            cpb.ConnectChannelRequest(channel="c", local_role="same", remote_role="same"),
            "INVALID_NAME",
        ),
        (cpb.ConnectChannelRequest(channel="c", mode=99), "INVALID_ARGUMENT"),  # type: ignore[arg-type]
        (cpb.ConnectChannelRequest(channel="c", prefetch=100_000), "INVALID_ARGUMENT"),
        (cpb.ConnectChannelRequest(channel="c", from_id=3), "INVALID_ARGUMENT"),
        (
            cpb.ConnectChannelRequest(channel="c", ttl=duration_pb2.Duration(seconds=-1)),
            "INVALID_ARGUMENT",
        ),
    ],
)
async def test_bad_connect_requests_are_refused(
    servicers: Servicers, request_: cpb.ConnectChannelRequest, reason: str
) -> None:
    """(Moved here from the socket tests: a status mapping, no path.)"""
    await refused_as_invalid(servicers, "ChannelService", request_, reason)
