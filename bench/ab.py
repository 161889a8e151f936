"""A/B bench: this work tree against any git revision, the same workload, interleaved.

Checks ``REV`` out into a temporary git worktree and runs one of the benches
(``core_bench``, ``gateway_bench``, ``federation_bench``) alternately on both trees for
``--rounds`` rounds (A B, then B A, ...): the bench script is always this tree's, so the
workload is the same; each side imports its own ``core/`` and ``gateway/`` (put first on
``PYTHONPATH``, also for the gateway processes a bench starts). Prints, per run and
figure, the median of each side and the ratio this tree / REV.

    .venv/bin/python bench/ab.py HEAD~1                          # core, amo + rate, 3 rounds
    .venv/bin/python bench/ab.py cd9b458 --rounds 5 -- --seconds 5 --modes amo,alo,rate
    .venv/bin/python bench/ab.py HEAD --bench gateway -- --seconds 5 --workers 1
    .venv/bin/python bench/ab.py HEAD --bench federation -- --seconds 5
    .venv/bin/python bench/ab.py 699ae03~1 --a 699ae03      # two revisions, neither this tree
    .venv/bin/python bench/ab.py HEAD --a-extra "--tracing sdk"  # a feature on (A) and off (B)

The machine's steal (cores the hypervisor gave to other guests during each round) and
the bench process's longest garbage-collection pause are shown beside the figures,
without a ratio: on a shared VM they tell a round that lost its cores, or stalled in
the bench itself, from one that got slower.

Uncommitted changes count as this tree's, so ``ab.py HEAD`` measures them. Before landing
a change to a hot path, run it against the previous commit and show its table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCHES = {
    "core": ["--seconds", "5", "--warmup", "1", "--modes", "amo,rate", "--impl", "busmq"],
    "gateway": ["--seconds", "5", "--workers", "1", "--idle-streams", "0"],
    "federation": ["--seconds", "5", "--outbox-messages", "2000"],
}
# Figures where more is better; for the rest (latency, CPU per message) less is better.
HIGHER_IS_BETTER = {"consumed/s"}
# Figures of the machine, not of the code: shown beside the others, without a ratio.
CONTEXT = {"steal cores", "client gc ms"}
CORE_FIGURES = {
    "consumed/s": lambda r: r["consumed_per_s"],
    "p50 ms": lambda r: r["p50_ms"],
    "p99 ms": lambda r: r["p99_ms"],
    "p99.9 ms": lambda r: r["p999_ms"],
    "client us/msg": lambda r: _per_msg(r["client_cpu"], r),
    "redis us/msg": lambda r: _per_msg(r["redis_cpu"], r),
    "steal cores": lambda r: r.get("steal_cpu", math.nan),
    "client gc ms": lambda r: r.get("gc_longest_ms", math.nan),
}
FIXED_RATE_SKIP = {"consumed/s"}  # a fixed-rate run consumes what it is given


def _missing(value: Any) -> bool:
    """A figure a run did not measure (JSON null, or NaN)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _per_msg(cores: float, result: dict[str, Any]) -> float:
    rate = result["consumed_per_s"]
    return cores * 1e6 / rate if rate else math.nan


Rows = dict[str, dict[str, float]]  # run label -> figure -> value


def rows_of(bench: str, payload: dict[str, Any]) -> Rows:
    """The figures of one bench run, by run label."""
    if bench == "core":
        rows: Rows = {}
        for result in payload["results"]:
            label = f"{result['impl']} {result['scenario']}"
            skip = FIXED_RATE_SKIP if result["scenario"] == "rate" else set()
            figures = {n: get(result) for n, get in CORE_FIGURES.items() if n not in skip}
            rows[label] = {n: v for n, v in figures.items() if not _missing(v)}
        return rows
    out: Rows = {}
    for row in payload["rows"]:
        figures = {k: v for k, v in row.items() if k != "label" and not _missing(v)}
        if "flood" not in row["label"]:
            figures.pop("consumed/s", None)
        else:  # a flood's latency is its window's, not the path's
            for key in ("p50 ms", "p99 ms", "p99.9 ms"):
                figures.pop(key, None)
        out[row["label"]] = figures
    return out


def run_once(bench: str, tree: Path, extra: Sequence[str], out: Path) -> Rows:
    env = dict(os.environ)
    paths = [str(tree / "core"), str(tree / "gateway")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    script = ROOT / "bench" / f"{bench}_bench.py"
    command = [sys.executable, str(script), *extra, "--json", str(out)]
    completed = subprocess.run(
        command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if completed.returncode != 0 or not out.exists():
        tail = "\n".join(completed.stdout.splitlines()[-15:])
        raise RuntimeError(f"{bench}_bench on {tree} failed ({completed.returncode}):\n{tail}")
    rows = rows_of(bench, json.loads(out.read_text()))
    out.unlink()
    return rows


def median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def table(this: str, rev: str, sides: dict[str, list[Rows]]) -> str:
    rounds = len(sides["A"])
    lines = [
        f"A = {this}, B = {rev}; medians of {rounds} interleaved rounds",
        "",
        f"{'run':<36}{'figure':<15}{'A':>12}{'B':>12}{'A/B':>8}  {'A rounds'}",
    ]
    lines.append("-" * len(lines[-1]))
    labels = list(dict.fromkeys(label for rows in sides["A"] for label in rows))
    for label in labels:
        names = list(dict.fromkeys(n for rows in sides["A"] for n in rows.get(label, {})))
        title = label
        for name in names:
            a = [rows[label][name] for rows in sides["A"] if label in rows]
            b = [rows[label][name] for rows in sides["B"] if label in rows and name in rows[label]]
            ma, mb = median(a), median(b)
            ratio = ma / mb if mb and not math.isnan(mb) else math.nan
            better = "" if math.isnan(ratio) else _verdict(name, ratio)
            cell = f"{ratio:>7.2f}x{better}" if name not in CONTEXT else f"{'':>9}"
            spread = " ".join(_fmt(v) for v in a)
            lines.append(f"{title:<36}{name:<15}{_fmt(ma):>12}{_fmt(mb):>12}{cell}  {spread}")
            title = ""
    return "\n".join(lines)


def _verdict(name: str, ratio: float) -> str:
    gain = ratio if name in HIGHER_IS_BETTER else 1 / ratio if ratio else math.inf
    if gain >= 1.05:
        return "+"
    if gain <= 0.95:
        return "-"
    return " "


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("rev", help="the git revision to compare with (B)")
    parser.add_argument(
        "--a", metavar="REV", help="measure this revision as A instead of this work tree"
    )
    parser.add_argument(
        "--a-extra",
        default="",
        metavar="ARGS",
        help="more bench arguments for A only (a feature on against the same code without it)",
    )
    parser.add_argument("--bench", choices=sorted(BENCHES), default="core")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args, extra = parser.parse_known_args(argv)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return args, extra or BENCHES[args.bench]


def _resolve(rev: str) -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def _worktree(path: Path, sha: str) -> Path:
    command = ["git", "worktree", "add", "--detach", "--quiet", str(path), sha]
    subprocess.run(command, cwd=ROOT, check=True)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = parse(argv)
    sha = _resolve(args.rev)
    a_sha = _resolve(args.a) if args.a else None
    with tempfile.TemporaryDirectory(prefix="busmq-ab-") as tmp:
        trees = {"A": ROOT, "B": _worktree(Path(tmp) / "b", sha)}
        try:
            if a_sha is not None:
                trees["A"] = _worktree(Path(tmp) / "a", a_sha)
            sides: dict[str, list[Rows]] = {"A": [], "B": []}
            for round_ in range(args.rounds):
                order = ("A", "B") if round_ % 2 == 0 else ("B", "A")
                for side in order:
                    print(f"round {round_ + 1}/{args.rounds}: {side} ...", file=sys.stderr)
                    side_extra = [*extra, *shlex.split(args.a_extra)] if side == "A" else extra
                    rows = run_once(args.bench, trees[side], side_extra, Path(tmp) / "out.json")
                    sides[side].append(rows)
        finally:
            for tree in trees.values():
                if tree != ROOT:
                    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
    print(f"{args.bench}_bench {' '.join(extra)}")
    this = f"{args.a} ({a_sha[:9]})" if a_sha else "this tree"
    print(table(this, f"{args.rev} ({sha[:9]})", sides))
    if args.json:
        payload = {"a": a_sha or "work tree", "b": sha, "args": extra, "sides": sides}
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
