"""The Dockerfile's structure (no Docker engine runs here): slim base, non-root, serve, healthcheck.

hadolint lints it where the test extra installed it; the healthcheck command
itself is run against a real ``callbridge serve``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from tests.conftest import ServedBridge

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def instructions() -> list[dict[str, str]]:
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    parsed: list[dict[str, str]] = parser.structure
    return parsed


def of(instructions: list[dict[str, str]], name: str) -> list[str]:
    return [i["value"] for i in instructions if i["instruction"] == name]


def test_slim_python_base(instructions: list[dict[str, str]]) -> None:
    (base,) = of(instructions, "FROM")
    assert base.startswith("python:3.") and base.endswith("-slim")


def test_runs_as_non_root_before_the_command(instructions: list[dict[str, str]]) -> None:
    names = [i["instruction"] for i in instructions]
    users = of(instructions, "USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert names.index("USER") < names.index("CMD")


def test_installs_the_package_and_serves(instructions: list[dict[str, str]]) -> None:
    assert any("pip install" in run and " ." in run for run in of(instructions, "RUN"))
    (cmd,) = of(instructions, "CMD")
    assert json.loads(cmd) == ["callbridge", "serve"]
    for copy in of(instructions, "COPY"):
        for source in copy.split()[:-1]:
            assert (ROOT / source).exists(), f"COPY source {source} missing"


def test_exposes_the_port_it_listens_on(instructions: list[dict[str, str]]) -> None:
    env = " ".join(of(instructions, "ENV"))
    assert "CALLBRIDGE_SERVER__HOST=0.0.0.0" in env
    (port,) = of(instructions, "EXPOSE")
    assert f"CALLBRIDGE_SERVER__PORT={port}" in env


def healthcheck_command(instructions: list[dict[str, str]]) -> list[str]:
    (check,) = of(instructions, "HEALTHCHECK")
    exec_form = check[check.index("CMD") + 3 :].strip()
    command: list[str] = json.loads(exec_form)
    return command


def test_healthcheck_probes_healthz_and_works(instructions: list[dict[str, str]], served_bridge: ServedBridge) -> None:
    command = healthcheck_command(instructions)
    assert "/healthz" in " ".join(command)
    (port,) = of(instructions, "EXPOSE")
    probe = [sys.executable if part == "python" else part.replace(f":{port}/", f":{served_bridge.port}/") for part in command]
    assert subprocess.run(probe, timeout=20).returncode == 0
    served_bridge.process.kill()
    served_bridge.process.wait(timeout=10)
    assert subprocess.run(probe, timeout=20, capture_output=True).returncode != 0


def test_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (the test extra installs it on x86-64 Linux)")
    result = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
