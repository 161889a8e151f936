"""Requests that do not parse: ``INVALID_ARGUMENT`` with reason ``MALFORMED_REQUEST``.

grpcio deserializes a request before the servicer sees it; a failure there ends the
call ``UNKNOWN`` and logs a traceback per call. The method guard
(:mod:`busmq_gateway.guard`) registers every handler again with a deserializer that
turns a parse failure into a marker (:func:`tolerant`), which it answers with the
mapped status. Refusals are logged once per interval with their count, so a flood of
garbage cannot fill a disk.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from .throttle import INTERVAL_SECONDS, ThrottledLog

log = logging.getLogger(__name__)


class _Malformed:
    """What a request that did not parse is deserialized to."""


MALFORMED = _Malformed()


class MalformedLog:
    """Counts refused malformed requests; logs them through a :class:`ThrottledLog`
    (the first of an interval, then how many followed)."""

    def __init__(self, interval: float = INTERVAL_SECONDS) -> None:
        self.total = 0
        self._log = ThrottledLog(log, interval)

    def refused(self, method: str) -> None:
        self.total += 1
        self._log.log("malformed", logging.WARNING, "refused a malformed request (%s)", method)


def tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``parse``, answering :data:`MALFORMED` for bytes that do not parse."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except (DecodeError, ValueError, RuntimeError):
            return MALFORMED

    return deserialize
