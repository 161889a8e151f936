"""``busmq federation status``: the federation links of running applications.

A link's state, outbox and lag live in the process that federates (its bus holds the
links and the outbox), so the command reads them where that process publishes them:
its metrics endpoint (:mod:`busmq.metrics`, or a gateway's ``/metrics``), parsed with
prometheus_client's own parser.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .output import Output, seconds

FIELDS = {
    "busmq_federation_link_up": "up",
    "busmq_federation_outbox_messages": "outbox",
    "busmq_federation_outbox_age_seconds": "outbox_age_seconds",
    "busmq_federation_lag_messages": "lag_messages",
    "busmq_federation_lag_seconds": "lag_seconds",
    "busmq_federation_resumes_total": "resumes",
}


def parse_targets(text: str, source: str) -> list[dict[str, Any]]:
    """The federation targets in one scrape of busmq metrics, by target URL."""
    targets: defaultdict[str, dict[str, Any]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            target = sample.labels.get("target")
            if target is None:
                continue
            if sample.name == "busmq_federation_link_state" and sample.value == 1:
                targets[target]["state"] = sample.labels["state"]
            elif sample.name in FIELDS:
                value = sample.value
                targets[target][FIELDS[sample.name]] = (
                    value if "seconds" in sample.name else int(value)
                )
    return [
        {"source": source, "target": url, "state": "unknown", **fields}
        for url, fields in sorted(targets.items())
    ]


async def status(out: Output, args: argparse.Namespace, secret: str | None) -> int:
    import aiohttp  # here: the other commands start without it (a fifth of their start-up CPU)

    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    found: list[dict[str, Any]] = []
    failed = 0
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for url in args.metrics:
            try:
                async with session.get(url, headers=headers) as response:
                    if response.status != 200:
                        raise aiohttp.ClientError(f"HTTP {response.status}")
                    found += parse_targets(await response.text(), url)
            except (aiohttp.ClientError, TimeoutError) as exc:
                out.error(f"{url}: {exc or type(exc).__name__}")
                failed += 1
    if out.as_json:
        out.json(found)
    else:
        rows = [
            (t["target"], t["state"], t.get("outbox", 0), seconds(t.get("outbox_age_seconds", 0)),
             t.get("lag_messages", 0), seconds(t.get("lag_seconds", 0)), t.get("resumes", 0),
             t["source"])
            for t in found
        ]  # fmt: skip
        columns = (
            "target",
            "state",
            "outbox",
            "outbox age",
            "lag",
            "lag (time)",
            "resumes",
            "from",
        )
        out.table(f"{len(found)} federation link(s)", columns, rows)
    if failed:
        return 1
    down = [t for t in found if t.get("up") == 0]
    return 5 if down and args.fail_if_down else 0
