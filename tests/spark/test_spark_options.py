"""Offsets and micro-batch bounds of the Spark source (no Spark needed)."""

from __future__ import annotations

import pytest

from busmq.spark._core import OptionError, bounded_end, parse_offset, split

pytestmark = pytest.mark.spark


def test_bounded_end_shares_the_budget_and_never_goes_back() -> None:
    assert bounded_end({"a": 0, "b": 0}, {"a": 10, "b": 10}, 100) == {"a": 10, "b": 10}
    end = bounded_end({"a": 0, "b": 5}, {"a": 1000, "b": 7}, 10)
    assert end == {"a": 8, "b": 7} and sum(end.values()) - 5 == 10
    assert bounded_end({"a": 9}, {"a": 3}, 10) == {"a": 9}
    assert bounded_end({"a": 0, "b": 0, "c": 0}, {"a": 5, "b": 5, "c": 5}, 1) == {
        "a": 1,
        "b": 0,
        "c": 0,
    }


def test_parse_offset() -> None:
    assert parse_offset('{"a": 3}', ["a", "b"]) == {"a": 3, "b": 0}
    assert parse_offset({"a": 3, "b": 4}, ["a"]) == {"a": 3}
    for bad in ("[1]", "{", '{"a": -1}', '{"a": "3"}', '{"a": true}'):
        with pytest.raises(OptionError, match="bad busmq offset"):
            parse_offset(bad, ["a"])


def test_split() -> None:
    spans = split("redis://h", "q", 1, 250, 100)
    assert [(s.low, s.high) for s in spans] == [(1, 100), (101, 200), (201, 250)]
