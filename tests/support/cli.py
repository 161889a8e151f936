"""Running the ``busmq`` command line as a process, as a user would."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines()]


async def busmq(
    *args: str, urls: Sequence[str] = (), stdin: bytes | None = None, timeout: float = 30
) -> Result:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSMQ_")}
    if urls:
        env["BUSMQ_REDIS_URLS"] = ",".join(urls)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "busmq", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(stdin), timeout)
    assert process.returncode is not None
    return Result(process.returncode, out.decode(), err.decode())
