"""``@cpu_heavy``: the tests that keep a core busy for most of their run (soaks, chaos
with several gateways, many failovers, thousands of streams at once). Under
pytest-xdist's ``--dist loadgroup`` they share one group, so one worker runs them one
after another: two of them side by side starve each other's gateways and Redis servers
of CPU on a machine of two cores, and their deadlines were written for one at a time."""

import pytest

cpu_heavy = pytest.mark.xdist_group("cpu-heavy")
