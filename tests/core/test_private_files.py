"""Files that hold messages or secrets stay private to their owner under a usual umask
(022): the embedded Redis's data directory, the federation outbox, exports; secret
files that others can read are refused."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from busmq import Bus, BusSettings
from busmq.embedded import EmbeddedRedis
from busmq.federation.outbox import Outbox
from busmq.private import ExposedSecretError, private_dir, private_file, read_secret_file
from tests.support.cli import busmq
from tests.support.redis_server import RedisServer


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def modes_open_to_others(root: Path) -> dict[str, str]:
    """Everything under ``root`` (and root) that group or others can reach, by mode."""
    found = {}
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            found[str(path.relative_to(root.parent))] = f"{mode:04o}"
    return found


async def test_a_fresh_embedded_redis_data_directory_is_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "data" / "redis"
    async with Bus(BusSettings(data_dir=data_dir)) as bus, bus.queue("private") as queue:
        await queue.push("a payload other users must not read")
    names = {p.name for p in data_dir.rglob("*")}
    assert {"busmq.lock", "redis.log"} <= names and any(".aof" in n for n in names)
    assert modes_open_to_others(data_dir) == {}


async def test_an_existing_data_directory_open_to_others_is_tightened_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "redis"
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="busmq.private"):
        async with EmbeddedRedis(data_dir):
            pass
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert "open to other local users (mode 0755): made private" in caplog.text


def test_a_directory_or_file_this_process_cannot_tighten_is_used_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # As with a volume mounted for a group (Kubernetes' fsGroup): writable, not ours.
    data_dir, outbox = tmp_path / "redis", tmp_path / "outbox.sqlite3"
    data_dir.mkdir(mode=0o775)
    data_dir.chmod(0o775)
    outbox.touch(mode=0o664)
    outbox.chmod(0o664)

    def not_the_owner(*args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(Path, "chmod", not_the_owner)
    monkeypatch.setattr(os, "fchmod", not_the_owner)
    with caplog.at_level(logging.WARNING, logger="busmq.private"):
        assert private_dir(data_dir) == data_dir
        private_file(outbox)
    assert f"cannot make it private: restrict it (chmod 700 {data_dir})" in caplog.text
    assert f"cannot make it private: restrict it (chmod 600 {outbox})" in caplog.text


async def test_the_outbox_directory_and_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "federation" / "outbox.sqlite3"
    outbox = Outbox(path, max_messages=100, max_age=None)
    await outbox.open()
    await outbox.append("http://a:1", "q", "r1", 1, b"a payload")
    files = sorted(p.name for p in path.parent.iterdir())
    assert {"outbox.sqlite3", "outbox.sqlite3.lock", "outbox.sqlite3-wal"} <= set(files)
    assert modes_open_to_others(path.parent) == {}, files
    await outbox.close()


async def test_an_existing_outbox_file_open_to_others_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    path.touch(mode=0o644)
    path.chmod(0o644)
    outbox = Outbox(path, max_messages=100, max_age=None)
    await outbox.open()
    await outbox.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_secret_file_others_can_read_is_refused_with_the_chmod_to_run(
    tmp_path: Path, mode: int
) -> None:
    secret = tmp_path / "gateway.secret"
    secret.write_text("s3cret-value-long-enough-to-be-a-real-one\n")
    secret.chmod(mode)
    with pytest.raises(ExposedSecretError) as error:
        read_secret_file(secret)
    assert f"mode {mode:04o}" in str(error.value)
    assert f"chmod 600 {secret}" in str(error.value)
    assert "s3cret" not in str(error.value)
    secret.chmod(0o600)
    assert read_secret_file(secret).strip() == "s3cret-value-long-enough-to-be-a-real-one"
    secret.chmod(0o400)
    assert read_secret_file(secret).strip() == "s3cret-value-long-enough-to-be-a-real-one"


async def test_an_export_file_is_created_private(tmp_path: Path, redis_server: RedisServer) -> None:
    settings = BusSettings(redis_urls=(redis_server.url,))
    async with Bus(settings) as bus, bus.queue("exported") as queue:
        await queue.push_batch(["one", "two"])
        target = tmp_path / "exported.jsonl"
        result = await busmq("export", "exported", str(target), urls=[redis_server.url])
        assert result.code == 0, result.err
    assert len(target.read_text().splitlines()) == 2
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


async def test_the_cli_refuses_a_secret_file_others_can_read(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    secret = tmp_path / "cli.secret"
    secret.write_text("s3cret-value-long-enough-to-be-a-real-one\n")
    secret.chmod(0o644)
    result = await busmq(
        "--gateway", "http://127.0.0.1:1", "--secret-file", str(secret), "queues",
        urls=[redis_server.url],
    )  # fmt: skip
    assert result.code != 0
    assert f"chmod 600 {secret}" in " ".join(result.err.split())
