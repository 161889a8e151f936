"""Processing controls between their proto messages and the core (``busmq.controls``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from google.protobuf import timestamp_pb2

from busmq import Producer, QueueInfo, RateLimit, RetryPolicy
from busmq.v1 import queue_service_pb2 as pb

from .convert import duration, seconds
from .errors import RequestError

MAX_DELAY_SECONDS = 366 * 24 * 3600.0
"""Longest delay, ttl or retry delay accepted: a year (and a day)."""


def push_timing(request: pb.PushRequest) -> dict[str, Any]:
    """The push's ``delay``/``at`` and ``ttl``/``expires_at`` as core keyword arguments."""
    timing: dict[str, Any] = {}
    if request.HasField("delay") and request.HasField("deliver_at"):
        raise RequestError("give delay or deliver_at, not both")
    if request.HasField("ttl") and request.HasField("expires_at"):
        raise RequestError("give ttl or expires_at, not both")
    if request.HasField("delay"):
        timing["delay"] = _bounded(seconds(request.delay, "delay"), "delay")
    if request.HasField("deliver_at"):
        timing["at"] = _time(request.deliver_at)
    if request.HasField("ttl"):
        ttl = _bounded(seconds(request.ttl, "ttl"), "ttl")
        if ttl <= 0:
            raise RequestError("ttl must be positive")
        timing["ttl"] = ttl
    if request.HasField("expires_at"):
        timing["expires_at"] = _time(request.expires_at)
    return timing


def producer_sequence(request: pb.PushRequest) -> dict[str, Any]:
    """The push's idempotent producer (``producer`` and ``sequence``) as core keyword
    arguments; none without a producer name."""
    if not request.producer:
        if request.producer_epoch or request.producer_sequence:
            raise RequestError("producer_epoch and producer_sequence need a producer")
        return {}
    producer = Producer(request.producer, request.producer_epoch)
    return {"producer": producer, "sequence": request.producer_sequence}


def retry_policy(request: pb.ConsumeRequest) -> RetryPolicy | None:
    if not request.HasField("retry_policy"):
        return None
    proto = request.retry_policy
    try:
        return RetryPolicy(
            initial=_bounded(seconds(proto.initial, "retry_policy.initial"), "initial"),
            factor=proto.factor or 1.0,
            max_delay=_bounded(seconds(proto.max_delay, "retry_policy.max_delay"), "max_delay")
            if proto.HasField("max_delay")
            else MAX_DELAY_SECONDS,
            jitter=proto.jitter,
        )
    except ValueError as exc:
        raise RequestError(str(exc)) from None


def rate_limit(proto: pb.RateLimit) -> RateLimit:
    per = seconds(proto.per, "rate_limit.per") if proto.HasField("per") else 1.0
    try:
        return RateLimit(proto.limit, per, proto.key or None)
    except ValueError as exc:
        raise RequestError(str(exc)) from None


def rate_limit_proto(limit: RateLimit | None) -> pb.RateLimit | None:
    if limit is None:
        return None
    return pb.RateLimit(limit=limit.limit, per=duration(limit.per_seconds), key=limit.key or "")


def info_fields(info: QueueInfo) -> dict[str, Any]:
    """The controls part of a ``GetQueueResponse``."""
    return {
        "pending": info.pending,
        "delayed": info.delayed,
        "dead_letters": info.dead_letters,
        "paused": info.paused,
        "rate_limit": rate_limit_proto(info.rate_limit),
        "key_rate_limit": rate_limit_proto(info.key_rate_limit),
        "max_deliveries": info.max_deliveries or 0,
        "drop_expired": info.drop_expired,
        "mode": info.mode or "",
        **ordering_fields(info),
    }


def ordering_fields(info: QueueInfo) -> dict[str, Any]:
    state = info.ordering_state
    if info.ordering is None or state is None:
        return {}
    fields: dict[str, Any] = {
        "ordering_key": info.ordering,
        "ordered_keys_in_flight": state.keys_in_flight,
        "ordered_waiting": state.waiting,
    }
    if state.oldest_waiting_age is not None:
        fields["oldest_ordered_wait"] = duration(state.oldest_waiting_age)
    return fields


def _bounded(value: float, name: str) -> float:
    if value > MAX_DELAY_SECONDS:
        raise RequestError(f"{name} must be at most {MAX_DELAY_SECONDS:.0f} seconds")
    return value


LATEST_TIMESTAMP = 253_402_300_799  # 9999-12-31T23:59:59Z, the last one protobuf allows


def _time(stamp: timestamp_pb2.Timestamp) -> datetime:
    if stamp.seconds < 0:
        raise RequestError("timestamps must be after 1970")
    if stamp.seconds > LATEST_TIMESTAMP or not 0 <= stamp.nanos <= 999_999_999:
        raise RequestError("not a valid timestamp (after year 9999, or nanos out of range)")
    return datetime.fromtimestamp(stamp.seconds + stamp.nanos / 1e9, UTC)
