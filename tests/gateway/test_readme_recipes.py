"""The README's shell recipes, run as a new user would: the first command
(``bash scripts/run.sh``), then the grpcurl block that follows it; and the TLS recipe of
section Security (certificates made with openssl, a gateway with mTLS, grpcurl with the
CA). As written, but for the address: a free loopback port instead of 8443."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.gateway_process import GatewayProcess, gateway_env, spawn_until_ready
from tests.support.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCUMENTED_ADDRESS = "127.0.0.1:8443"

pytestmark = pytest.mark.slow


def bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", markdown, flags=re.MULTILINE | re.DOTALL)


def block_with(*texts: str) -> str:
    [block] = [b for b in bash_blocks(README.read_text()) if all(t in b for t in texts)]
    return block


def grpcurl_recipe() -> str:
    return block_with("grpcurl", "-plaintext")


async def test_the_grpcurl_recipe_works_right_after_scripts_run_sh(tmp_path: Path) -> None:
    recipe = grpcurl_recipe()
    assert DOCUMENTED_ADDRESS in recipe
    address = f"127.0.0.1:{free_port()}"
    env = gateway_env()
    env["BUSMQ_DATA_DIR"] = str(tmp_path / "redis")  # the embedded Redis's data
    # setup.sh may install what is missing first
    gateway, output = await spawn_until_ready(
        "bash", "scripts/run.sh", "--listen", address, cwd=ROOT, env=env, timeout=180
    )
    try:
        embedded = [p for p in psutil.Process(gateway.pid).children() if "redis" in p.name()]
        assert embedded, "the gateway runs on an embedded redis-server"

        code, text = await bash(recipe.replace(DOCUMENTED_ADDRESS, address), ROOT, env)
        assert code == 0, text
        assert "busmq.v1.QueueService" in text and "grpc.health.v1.Health" in text
        replies = [json.loads(doc) for doc in split_json_documents(text)]
        pushed = next(r for r in replies if "ids" in r)
        delivered = next(r for r in replies if "delivery" in r)["delivery"]["message"]
        assert delivered["payload"] == "aGk="  # "hi", as pushed
        assert delivered["id"] == pushed["ids"][0]
    finally:
        if gateway.returncode is None:
            gateway.send_signal(signal.SIGINT)  # Ctrl-C, as the README says
        code = await asyncio.wait_for(gateway.wait(), 30)
    assert code == 0, "".join(output)
    assert not any(p.is_running() and p.status() != "zombie" for p in embedded)


async def test_the_operating_recipe_works_right_after_scripts_run_sh(tmp_path: Path) -> None:
    recipe = block_with("busmq push orders", "busmq federation status")
    documented_http = "127.0.0.1:8444"
    assert DOCUMENTED_ADDRESS in recipe and documented_http in recipe
    address, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    export = tmp_path / "orders.jsonl"
    env = gateway_env()
    env["BUSMQ_DATA_DIR"] = str(tmp_path / "redis")
    env["BUSMQ_GATEWAY_HTTP_LISTEN"] = http
    gateway, output = await spawn_until_ready(
        "bash", "scripts/run.sh", "--listen", address, cwd=ROOT, env=env, timeout=180
    )
    try:
        script = (
            recipe.replace(DOCUMENTED_ADDRESS, address)
            .replace(documented_http, http)
            .replace("/tmp/orders.jsonl", str(export))
        )
        code, text = await bash(script, ROOT, env)
        assert code == 0, text
        assert "pushed 3 message(s) into orders: ids 1..3" in text
        assert "imported 3 message(s) into orders-restored" in text
        assert "copied 2 message(s) into orders-replay" in text
        assert "#1 source=cli first" in text  # the tail
        assert "0 dead letter(s) shown" in text
        assert "0 federation link(s)" in text
        assert "pushed 3, consumed 3" in text  # the demo, on the gateway's embedded Redis
        [listed] = [json.loads(line) for line in text.splitlines() if line.startswith("[{")]
        assert {q["name"]: q["depth"] for q in listed} == {
            "orders": 3, "orders-restored": 3, "orders-replay": 2, "demo": 0,
        }  # fmt: skip
        assert [json.loads(line)["payload"] for line in export.read_text().splitlines()] == [
            "first", "second", "third",
        ]  # fmt: skip
    finally:
        if gateway.returncode is None:
            gateway.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(gateway.wait(), 30)
    assert code == 0, "".join(output)


def split_json_documents(text: str) -> list[str]:
    """grpcurl prints one JSON document per reply, after the plain ``list`` lines."""
    decoder, documents, index = json.JSONDecoder(), [], text.find("{")
    while index != -1:
        _, end = decoder.raw_decode(text, index)
        documents.append(text[index:end])
        index = text.find("{", end)
    return documents


async def test_the_tls_recipe_makes_certificates_that_serve_mtls(tmp_path: Path) -> None:
    make_certs = block_with("openssl req -x509")
    serve = block_with("busmq-gateway --listen 0.0.0.0:8443")
    call = block_with("grpcurl -cacert")
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)  # this run's venv
    (tmp_path / ".busmq-secret").write_text("readme-tls-secret-0123456789\n")
    (tmp_path / ".busmq-secret").chmod(0o600)  # as scripts/run.sh makes it (umask 077)
    env = gateway_env()
    env["BUSMQ_DATA_DIR"] = str(tmp_path / "redis")

    made = await bash(make_certs, tmp_path, env)
    assert made[0] == 0, made[1]
    assert all((tmp_path / "tls" / f).exists() for f in ("ca.crt", "server.crt", "client.crt"))

    port = free_port()
    command = "exec " + serve.replace("0.0.0.0:8443", f"127.0.0.1:{port}").strip()
    gateway, _ = await spawn_until_ready("bash", "-c", command, cwd=tmp_path, env=env)
    try:
        call = call.replace(DOCUMENTED_ADDRESS, f"127.0.0.1:{port}")
        called = await bash(call, tmp_path, env)
        assert called[0] == 0, called[1]
        assert "busmq.v1.QueueService" in called[1]
        # mTLS: the same call without the client certificate is refused.
        no_cert = call.replace("-cert tls/client.crt -key tls/client.key ", "")
        assert (await bash(no_cert, tmp_path, env))[0] != 0
    finally:
        gateway.terminate()
        await gateway.wait()


async def bash(script: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    shell = await asyncio.create_subprocess_exec(
        "bash", "-euo", "pipefail", "-c", script,
        cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(shell.communicate(), 60)
    assert shell.returncode is not None
    return shell.returncode, out.decode()


async def test_the_python_stubs_example_of_clients_readme_runs(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    text = (ROOT / "clients" / "README.md").read_text()
    [example] = re.findall(r"^```python\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    assert DOCUMENTED_ADDRESS in example
    secret = "clients-readme-secret-0123456789"
    (tmp_path / ".busmq-secret").write_text(secret + "\n")  # as scripts/run.sh writes it
    (tmp_path / ".busmq-secret").chmod(0o600)  # as scripts/run.sh makes it (umask 077)
    gateway = GatewayProcess(redis_server.url, (secret,))
    await gateway.start()
    try:
        script = example.replace(DOCUMENTED_ADDRESS, gateway.target)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(process.communicate(), 30)
    finally:
        await gateway.stop()
    assert process.returncode == 0, out.decode()
    assert out.decode() == "1 b'hi'\n"
