"""Each script carries only the prelude's definitions it uses (``scripts.used_prelude``);
every script runs against real Redis in the rest of the suite."""

from __future__ import annotations

import re
from importlib import resources

from busmq.scripts import Scripts, script_source, used_prelude

PRELUDE = """-- header
local GROUP = 'busmq'

local function a() return GROUP end

-- b's comment
local function b(x)
  -- inside b
  return a() .. x
end

local LIMIT, OTHER = 5, 6
local function c() return LIMIT end
"""


def test_only_the_definitions_used_are_kept_with_their_comments_in_order() -> None:
    assert used_prelude(PRELUDE, "return c()") == "\nlocal LIMIT, OTHER = 5, 6\n" + (
        "local function c() return LIMIT end\n"
    )
    kept = used_prelude(PRELUDE, "return b('y')")
    assert kept == (
        "-- header\nlocal GROUP = 'busmq'\n\n"
        "local function a() return GROUP end\n\n"
        "-- b's comment\nlocal function b(x)\n  -- inside b\n  return a() .. x\nend\n"
    )
    assert used_prelude(PRELUDE, "return 1") == ""


def test_every_script_defines_each_prelude_name_it_mentions() -> None:
    prelude = (resources.files("busmq") / "lua" / "prelude.lua").read_text()
    defined = set(re.findall(r"^local function (\w+)", prelude, re.MULTILINE))
    for name in Scripts.NAMES:
        source = script_source(name)
        own = set(re.findall(r"^local function (\w+)", source, re.MULTILINE))
        called = set(re.findall(r"\b(\w+)\(", source)) & defined
        assert called <= own, (name, called - own)
    assert "order_settled_all" not in script_source("push")  # a push frees no key
