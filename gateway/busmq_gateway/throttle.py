"""Logging that a caller cannot turn into a flood: at most one line per kind of event per
interval, then how many like it were left out.

Every event a client can cause at will (a refused call, an attachment left to lapse, a
stream dropped with deliveries unacked) goes through one, so the log grows with the
number of kinds of events, not with the number of calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable

INTERVAL_SECONDS = 60.0


class ThrottledLog:
    def __init__(self, logger: logging.Logger, interval: float = INTERVAL_SECONDS) -> None:
        self.logger = logger
        self.interval = interval
        self._next: dict[Hashable, float] = {}
        self._left_out: dict[Hashable, int] = {}

    def log(
        self,
        key: Hashable,
        level: int,
        message: str,
        *args: object,
        exc_info: BaseException | None = None,
    ) -> None:
        """Log ``message`` unless a line of kind ``key`` was logged less than an
        interval ago (then count it, and say how many at the next line of that kind)."""
        now = time.monotonic()
        if now < self._next.get(key, 0.0):
            self._left_out[key] = self._left_out.get(key, 0) + 1
            return
        left_out = self._left_out.pop(key, 0)
        if left_out:
            message += f" (and {left_out} like it in the {self.interval:.0f} s before)"
        self.logger.log(level, message, *args, exc_info=exc_info)
        self._next[key] = now + self.interval


class ClientGoneFilter(logging.Filter):
    """grpc logs, with a traceback, every call whose status it could not send because
    the client had already gone (cancelled, or past its deadline, while the servicer
    finished): a race no servicer can close, and one a client causes at will. This
    filter, on grpc's logger, replaces those records with one throttled line per method."""

    PREFIX = "ExecuteBatchError raised in core by servicer method"

    def __init__(self, interval: float = INTERVAL_SECONDS) -> None:
        super().__init__()
        self._log = ThrottledLog(logging.getLogger("busmq_gateway.calls"), interval)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(self.PREFIX):
            return True
        method = message[len(self.PREFIX) :].strip(" []")
        self._log.log(
            method,
            logging.INFO,
            "%s: the client was gone before its status was sent (cancelled or past its deadline)",
            method,
        )
        return False


def quiet_client_gone() -> None:
    """Install :class:`ClientGoneFilter` on grpc's logger (once)."""
    logger = logging.getLogger("grpc._cython.cygrpc")
    if not any(isinstance(f, ClientGoneFilter) for f in logger.filters):
        logger.addFilter(ClientGoneFilter())
