"""How the admin commands print: rich tables for people, JSON for scripts (``--json``),
progress bars on stderr so that stdout stays the command's result."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from ..controls import RateLimit


class Output:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        # Piped output is not cut to 80 columns: tables keep whole names for grep and awk.
        wide = None if sys.stdout.isatty() else 240
        self.console = Console(highlight=False, soft_wrap=True, width=wide)
        self.errors = Console(stderr=True, highlight=False)

    def json(self, value: Any) -> None:
        sys.stdout.write(json.dumps(value, ensure_ascii=False, default=str) + "\n")
        sys.stdout.flush()

    def line(self, text: str) -> None:
        """A plain result line (not markup: payloads may hold brackets)."""
        self.console.print(text, markup=False)

    def note(self, text: str) -> None:
        """Progress and summaries for people: stderr, so pipes get only results."""
        self.errors.print(text, markup=False, soft_wrap=True)

    def error(self, text: str) -> None:
        self.errors.print(f"busmq: {text}", markup=False, style="red", soft_wrap=True)

    def table(
        self, title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        table = Table(title=title, title_justify="left", header_style="bold")
        for index, column in enumerate(columns):
            table.add_column(column, justify="left" if index == 0 else "right")
        for row in rows:
            table.add_row(*(cell(value) for value in row))
        self.console.print(table)

    @contextmanager
    def progress(self, what: str, total: int | None) -> Iterator[Callable[[int], None]]:
        """A progress bar on stderr (a terminal only); yields ``advance(n)``."""
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=self.errors,
            transient=False,
            disable=self.as_json or not self.errors.is_terminal,
        )
        with bar:
            task = bar.add_task(what, total=total)
            yield lambda n: bar.advance(task, n)


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return seconds(value)
    if isinstance(value, RateLimit):
        return rate(value)
    return str(value)


def seconds(value: float) -> str:
    if value <= 0:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def rate(limit: RateLimit) -> str:
    per = f"{limit.per_seconds:g} s"
    text = f"{limit.limit}/{per}"
    return f"{text} per {limit.key}" if limit.key else text
