"""Scraping a Prometheus endpoint in tests: the samples parsed by prometheus_client's own
parser, looked up by name and labels."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


class Samples:
    """The samples of one scrape: ``samples["busmq_queue_depth", {"queue": "q"}]``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self._values[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def __getitem__(self, key: tuple[str, Mapping[str, str]]) -> float:
        name, labels = key
        return self._values[(name, frozenset(labels.items()))]

    def get(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        return self._values.get((name, frozenset((labels or {}).items())))

    def names(self) -> set[str]:
        return {name for name, _ in self._values}

    def labels_of(self, name: str) -> list[dict[str, str]]:
        return [dict(labels) for n, labels in self._values if n == name]


async def scrape(url: str, headers: Mapping[str, str] | None = None) -> Samples:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as response,
    ):
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/plain")
        return Samples(await response.text())
