"""A unary call through a link ends by the link's operation timeout even when gRPC's
own deadline does not end it (grpc/grpc#41036: with a retry policy, the C core can
leave a call hanging past its deadline): the call is cancelled and fails
``DEADLINE_EXCEEDED``, which the callers already handle."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from busmq.federation import FederationSettings, FederationTarget
from busmq.federation.link import DEADLINE_GUARD, Link


class CallThatNeverEnds:
    """What the C core hands back in that case: a call awaited forever."""

    def __init__(self) -> None:
        self.cancelled = False
        self.timeout: float | None = None

    def __await__(self) -> Any:
        return asyncio.get_running_loop().create_future().__await__()

    def cancel(self) -> bool:
        self.cancelled = True
        return True


async def test_a_call_past_its_deadline_is_cancelled_and_fails_deadline_exceeded() -> None:
    target = FederationTarget("http://127.0.0.1:1")
    link = Link(target, FederationSettings(targets=[target]), operation_timeout=0.2)
    call = CallThatNeverEnds()

    def ack(request: Any, *, timeout: float, **_: Any) -> CallThatNeverEnds:
        call.timeout = timeout
        return call

    link.stub = lambda kind=None: SimpleNamespace(Ack=ack)  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await link.call("Ack", object())
    waited = loop.time() - started
    assert failed.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "Ack: no answer within 0.2 s" in (failed.value.details() or "")
    assert call.cancelled
    assert call.timeout == 0.2  # gRPC's deadline is still the first to apply
    assert waited >= 0.2 + DEADLINE_GUARD  # gRPC had its chance first
