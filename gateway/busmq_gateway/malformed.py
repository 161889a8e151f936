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
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

log = logging.getLogger(__name__)

LOG_INTERVAL_SECONDS = 60.0


class _Malformed:
    """What a request that did not parse is deserialized to."""


MALFORMED = _Malformed()


class MalformedLog:
    """One log line per interval: the first refusal, then how many followed."""

    def __init__(self, interval: float = LOG_INTERVAL_SECONDS) -> None:
        self.interval = interval
        self.total = 0
        self._unlogged = 0
        self._next = 0.0

    def refused(self, method: str) -> None:
        self.total += 1
        self._unlogged += 1
        now = time.monotonic()
        if now >= self._next:
            log.warning(
                "refused %d malformed request(s) in the last %.0f s (latest: %s)",
                self._unlogged,
                self.interval,
                method,
            )
            self._unlogged = 0
            self._next = now + self.interval


def tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``parse``, answering :data:`MALFORMED` for bytes that do not parse."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except (DecodeError, ValueError, RuntimeError):
            return MALFORMED

    return deserialize
