"""Throttled logging (pure logic): one line per kind of event per interval, with the
count of those left out; grpc's client-gone records replaced by such lines."""

from __future__ import annotations

import logging

import pytest

from busmq_gateway.throttle import ClientGoneFilter, ThrottledLog


def test_one_line_per_kind_per_interval_then_the_count(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="throttled")
    throttled = ThrottledLog(logging.getLogger("throttled"), interval=0.0)
    throttled.log("a", logging.INFO, "event %s", 1)
    assert [r.getMessage() for r in caplog.records] == ["event 1"]

    slow = ThrottledLog(logging.getLogger("throttled"), interval=3600)
    caplog.clear()
    for n in range(1000):
        slow.log("refused", logging.INFO, "refused %d", n)
        slow.log("lapsed", logging.INFO, "lapsed %d", n)
    assert [r.getMessage() for r in caplog.records] == ["refused 0", "lapsed 0"]
    slow._next["refused"] = 0.0  # the interval has passed
    slow.log("refused", logging.INFO, "refused %d", 1000)
    assert caplog.records[-1].getMessage() == "refused 1000 (and 999 like it in the 3600 s before)"


def test_grpc_client_gone_records_become_one_line_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    gone = ClientGoneFilter(interval=3600)
    record = logging.LogRecord(
        "grpc._cython.cygrpc", logging.ERROR, __file__, 1,
        "ExecuteBatchError raised in core by servicer method [/busmq.v1.RequestService/Call]",
        None, None,
    )  # fmt: skip
    assert [gone.filter(record) for _ in range(50)] == [False] * 50
    [line] = [r for r in caplog.records if r.name == "busmq_gateway.calls"]
    assert line.getMessage().startswith("/busmq.v1.RequestService/Call: the client was gone")
    assert line.exc_info is None
    other = logging.LogRecord("grpc", logging.ERROR, __file__, 1, "something else", None, None)
    assert gone.filter(other)
