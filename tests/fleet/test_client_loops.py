"""The TypeScript and Go README consumer loops through nginx over three gateways, while
one gateway is SIGKILLed and then all three restart one by one (SIGTERM: drain), under
1,000 msg/s pushed in DC-A: every push is acked, and no error reaches either loop."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from tests.fleet.conftest import SECRET, Fleet
from tests.support.client_programs import build_go, build_typescript
from tests.support.heavy import cpu_heavy
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow


class Loop:
    """One client's README loop in its own process: what it acked, and its errors."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.argv = argv
        self.acked: set[int] = set()
        self.redelivered = 0
        self.errors: list[str] = []
        self.process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while line := await self.process.stdout.readline():
            words = line.decode().split()
            if words[:1] == ["acked"]:
                self.acked.add(int(words[1]))
                self.redelivered += int(words[2]) > 1
            elif words:
                self.errors.append(line.decode().strip())

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def stop(self) -> int:
        assert self.process is not None and self._reader is not None
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.process.wait(), 20)
        await self._reader
        return code


@cpu_heavy
async def test_typescript_and_go_loops_survive_a_kill_and_a_rolling_restart(
    fleet: Fleet, tmp_path: Path
) -> None:
    dist = await build_typescript()
    go_loop = await build_go("readmeloop", tmp_path)
    loops = {
        "ts-flow": Loop("typescript", ["node", str(dist / "test" / "readme_loop.js"),
                                       fleet.url, SECRET, "ts-flow"]),
        "go-flow": Loop("go", [str(go_loop), fleet.nginx.target, SECRET, "go-flow"]),
    }  # fmt: skip
    pushed: dict[str, list[int]] = {name: [] for name in loops}
    queues = [fleet.a.queue(name) for name in loops]
    for queue in queues:
        await queue.attach(ttl=120)
    for loop in loops.values():
        await loop.start()
    producing = True

    async def produce() -> None:  # 1,000 msg/s: 5 to each queue every 10 ms
        n = 0
        while producing:
            for queue in queues:
                pushed[queue.name] += await queue.push_batch([f"m{n + i}" for i in range(5)])
            n += 5
            await asyncio.sleep(0.01)  # the pace: 5 messages a queue per 10 ms

    def progress(n: int) -> asyncio.Future[None]:
        targets = {name: len(loop.acked) + n for name, loop in loops.items()}

        def grown() -> bool:
            dead = [loop.name for loop in loops.values() if not loop.alive()]
            assert not dead, f"loops ended: {dead}: {[lp.errors for lp in loops.values()]}"
            return all(len(loops[name].acked) >= target for name, target in targets.items())

        return asyncio.ensure_future(eventually(grown, timeout=30, what=f"{n} more acks each"))

    producer = asyncio.create_task(produce())
    try:
        await progress(300)
        victim = fleet.gateways[1]
        victim.signal(signal.SIGKILL)
        await victim.wait()
        await progress(500)
        await victim.start()
        for gateway in fleet.gateways:
            gateway.signal(signal.SIGTERM)
            assert await gateway.wait() == 0
            await progress(200)
            await gateway.start()
        await progress(300)
        producing = False
        await producer

        def all_acked() -> bool:
            return all(loops[name].acked.issuperset(ids) for name, ids in pushed.items())

        try:
            await eventually(all_acked, timeout=60, what="every push acked")
        except AssertionError:
            missing = {n: sorted(set(ids) - loops[n].acked)[:20] for n, ids in pushed.items()}
            raise AssertionError(f"not acked: {missing}") from None
    finally:
        producing = False
        await asyncio.gather(producer, return_exceptions=True)
        codes = {loop.name: await loop.stop() for loop in loops.values()}
    for name, loop in loops.items():
        assert loop.errors == [], (loop.name, loop.errors)
        print(f"{loop.name}: {len(pushed[name])} pushed, {len(loop.acked)} acked, "
              f"{loop.redelivered} redelivered")  # fmt: skip
    assert codes == {"typescript": 0, "go": 0}
