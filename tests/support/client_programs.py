"""The TypeScript and Go clients' programs, built for tests and benches: the TypeScript
client compiled (``npm run build``: ``dist/``), a Go command built in GOPATH mode against
Debian's packages (no module proxy), as ``clients/go/test.sh`` builds the client."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

CLIENTS = Path(__file__).resolve().parents[2] / "clients"
TYPESCRIPT, GO = CLIENTS / "typescript", CLIENTS / "go"


async def build_typescript() -> Path:
    """Compile the TypeScript client and its test and bench programs; ``dist/``."""
    await run(["npm", "run", "--silent", "build"], cwd=TYPESCRIPT)
    return TYPESCRIPT / "dist"


async def build_go(command: str, directory: Path) -> Path:
    """Build ``clients/go/cmd/<command>`` into ``directory``; the binary."""
    gopath = directory / "gopath"
    (gopath / "src" / "busmq.dev").mkdir(parents=True, exist_ok=True)
    link = gopath / "src" / "busmq.dev" / "go"
    if not link.exists():
        link.symlink_to(GO)
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"{gopath}:/usr/share/gocode",
        "GOFLAGS": "",
    }  # and Go's own build cache, which the Go client's tier (clients/go/test.sh) warms
    binary = directory / f"go-{command}"
    await run(["go", "build", "-o", str(binary), f"busmq.dev/go/cmd/{command}"], gopath, env)
    return binary


async def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    process = await asyncio.create_subprocess_exec(*argv, cwd=cwd, env=env)
    if await process.wait() != 0:
        raise RuntimeError(f"{' '.join(argv)} failed in {cwd}")
