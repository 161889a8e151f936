"""The wire API is checked against the last released one: ``proto/released-api.json`` is a
committed ``buf`` image (updated on purpose, with a note, when a break is intended), so the
check compares with something that stands still, not with the branch it runs on."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELEASED = ROOT / "proto" / "released-api.json"


def buf() -> str:
    found = shutil.which("buf", path=str(Path(sys.executable).parent)) or shutil.which("buf")
    assert found, "buf is installed with the dev tools (scripts/setup.sh --dev)"
    return found


def breaking(workspace: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [buf(), "breaking", "--against", str(RELEASED)],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_api_is_compatible_with_the_released_image() -> None:
    done = breaking(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_removed_field_is_reported_against_the_released_image(tmp_path: Path) -> None:
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    service = tmp_path / "proto" / "busmq" / "v1" / "queue_service.proto"
    text = service.read_text()
    field = "  string request_id = 3;\n"
    assert field in text
    service.write_text(text.replace(field, "", 1))  # PushRequest.request_id dropped
    done = breaking(tmp_path)
    assert done.returncode != 0
    assert "request_id" in done.stdout + done.stderr
