"""Core services kept for requests, one per name (each owns a reply queue)."""

from __future__ import annotations

import collections
import logging
from typing import Any

from busmq import Bus, BusError, Service

log = logging.getLogger(__name__)

KEPT_REQUESTERS = 256
"""Core services kept for requests (each holds a reply queue attached)."""


class Requesters:
    """Core services used for requests, one per name, reused (each owns a reply queue);
    beyond ``limit``, the least recently used one with no request in flight is closed."""

    def __init__(self, bus: Bus, limit: int = KEPT_REQUESTERS, **options: Any) -> None:
        self._bus = bus
        self._limit = limit
        self._options = options
        self._services: collections.OrderedDict[str, Service] = collections.OrderedDict()
        self._busy: collections.Counter[str] = collections.Counter()

    def acquire(self, name: str) -> Service:
        service = self._services.pop(name, None) or self._bus.service(name, **self._options)
        self._services[name] = service
        self._busy[name] += 1
        return service

    async def release(self, name: str) -> None:
        self._busy[name] -= 1
        if self._busy[name] <= 0:
            del self._busy[name]
        while len(self._services) > self._limit:
            idle = next((n for n in self._services if not self._busy[n]), None)
            if idle is None:
                return
            await self._close(self._services.pop(idle))

    async def close(self) -> None:
        services, self._services = list(self._services.values()), collections.OrderedDict()
        for service in services:
            await self._close(service)

    @staticmethod
    async def _close(service: Service) -> None:
        try:
            await service.close()
        except BusError as exc:
            log.warning("closing service %s: %s", service.name, exc)
