"""Summarise a py-spy ``--format raw`` (collapsed stacks) profile: top self and total time.

    .venv/bin/py-spy record -r 250 --format raw -o prof.txt -- \\
        .venv/bin/python bench/core_bench.py --impl busmq --modes amo --seconds 10
    .venv/bin/python bench/profile_summary.py prof.txt [--top 30] [--by file]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _key(frame: str, by: str) -> str:
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = match["file"]
    for marker in ("site-packages/", "core/", "bench/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    if by == "file":
        return path
    if by == "package":
        return path.split("/", 1)[0] if "/" in path else path
    return f"{match['func']} ({path})"


def summarise(path: Path, top: int, by: str, idle: tuple[str, ...]) -> str:
    self_time: Counter[str] = Counter()
    total_time: Counter[str] = Counter()
    samples = 0
    idle_samples = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = [f for f in stack.split(";") if f]
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        if frames and frames[0].startswith("thread "):
            frames = frames[1:]
        samples += count
        if not frames or any(token in frames[-1] for token in idle):
            idle_samples += count
            continue
        keys = [_key(f, by) for f in frames]
        self_time[keys[-1]] += count
        for key in set(keys):
            total_time[key] += count
    busy = samples - idle_samples
    out = [
        f"{samples} samples, {idle_samples} idle ({100 * idle_samples / max(samples, 1):.1f}%), "
        f"percentages below are of the {busy} busy samples",
        "",
        f"top {top} by self time:",
    ]
    for key, count in self_time.most_common(top):
        out.append(f"  {100 * count / max(busy, 1):5.1f}%  {key}")
    out += ["", f"top {top} by total (inclusive) time:"]
    for key, count in total_time.most_common(top):
        out.append(f"  {100 * count / max(busy, 1):5.1f}%  {key}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--by", choices=("function", "file", "package"), default="function")
    parser.add_argument(
        "--idle",
        default="select (selectors.py),poll (selectors.py)",
        help="comma list of leaf frames counted as idle (waiting in the event loop)",
    )
    args = parser.parse_args()
    idle = tuple(s.strip() for s in args.idle.split(",") if s.strip())
    print(summarise(args.profile, args.top, args.by, idle))


if __name__ == "__main__":
    main()
