"""The Dockerfile's structure (no Docker engine runs here): slim base, non-root, serve, healthcheck.

hadolint lints it where the test extra installed it; the healthcheck command
itself is run against a real ``callbridge serve``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from callbridge.config import Settings
from tests.conftest import ServedBridge, free_port, wait_http_ok
from tests.redis_server import redis_server

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


def pip_install_command(instructions: list[dict[str, str]]) -> list[str]:
    """The image's ``pip install`` step, as arguments (the ``RUN`` that installs the package, up to its ``&&``)."""
    (run,) = [run for run in of(instructions, "RUN") if "pip install" in run]
    step = next(part for part in run.split("&&") if "pip install" in part)
    return shlex.split(step.replace("\\\n", " "))


def test_installs_the_package_with_the_fleets_extra_and_serves(instructions: list[dict[str, str]]) -> None:
    command = pip_install_command(instructions)
    assert command[:2] == ["pip", "install"] and ".[redis]" in command  # deploy/kubernetes: registry.backend = "redis"
    (cmd,) = of(instructions, "CMD")
    assert json.loads(cmd) == ["callbridge", "serve"]
    for copy in of(instructions, "COPY"):
        for source in copy.split()[:-1]:
            assert (ROOT / source).exists(), f"COPY source {source} missing"


def test_exposes_every_listener_the_configuration_can_enable(instructions: list[dict[str, str]]) -> None:
    env = " ".join(of(instructions, "ENV"))
    assert "CALLBRIDGE_SERVER__HOST=0.0.0.0" in env
    (expose,) = of(instructions, "EXPOSE")
    exposed = set(expose.split())
    defaults = Settings()
    assert f"CALLBRIDGE_SERVER__PORT={defaults.server.port}" in env and f"{defaults.server.port}/tcp" in exposed
    assert {f"{defaults.sip.port}/udp", f"{defaults.sip.port}/tcp"} <= exposed
    assert f"{defaults.sip.rtp_port_min}-{defaults.sip.rtp_port_max}/udp" in exposed
    assert f"{defaults.audiosocket.port}/tcp" in exposed


def test_says_the_stop_timeout_the_drain_needs(instructions: list[dict[str, str]]) -> None:
    """Docker's default 10 s stop timeout kills a draining bridge mid-call; the Dockerfile says what to give."""
    text = (ROOT / "Dockerfile").read_text()
    asked = [int(seconds) for seconds in re.findall(r"--stop-timeout (\d+)", text)]
    assert asked and min(asked) > Settings().server.drain_timeout_s


def healthcheck_command(instructions: list[dict[str, str]]) -> list[str]:
    (check,) = of(instructions, "HEALTHCHECK")
    exec_form = check[check.index("CMD") + 3 :].strip()
    command: list[str] = json.loads(exec_form)
    return command


def test_healthcheck_probes_healthz_on_the_configured_port(
    instructions: list[dict[str, str]], served_bridge: ServedBridge
) -> None:
    command = healthcheck_command(instructions)
    assert "/healthz" in " ".join(command)
    probe = [sys.executable if part == "python" else part for part in command]
    env = {**os.environ, "CALLBRIDGE_SERVER__PORT": str(served_bridge.port)}
    assert subprocess.run(probe, timeout=20, env=env).returncode == 0
    served_bridge.process.kill()
    served_bridge.process.wait(timeout=10)
    assert subprocess.run(probe, timeout=20, capture_output=True, env=env).returncode != 0


def test_the_images_install_step_serves_the_kubernetes_configmap(
    instructions: list[dict[str, str]], tmp_path: Path
) -> None:
    """The image's own ``pip install`` in a fresh venv (no Docker here), from a copy of what the image COPYs, then
    ``callbridge serve`` on the ConfigMap's TOML with the image's env: the fleet as shipped starts (before, the
    install lacked the redis client and ``serve`` died with ModuleNotFoundError)."""
    import venv

    import yaml

    app = tmp_path / "app"
    app.mkdir()
    for copy in of(instructions, "COPY"):
        for source in copy.split()[:-1]:
            origin = ROOT / source
            if origin.is_dir():
                shutil.copytree(origin, app / source, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(origin, app / source)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    command = pip_install_command(instructions)
    installed = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", *command, "--quiet"], cwd=app, capture_output=True, text=True, timeout=900
    )
    assert installed.returncode == 0, installed.stderr[-3000:]

    (configmap,) = [d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/configmap.yaml").read_text()) if d]
    config = tmp_path / "callbridge.toml"
    config.write_text(configmap["data"]["callbridge.toml"])
    port = free_port()
    image_env = dict(part.split("=", 1) for value in of(instructions, "ENV") for part in shlex.split(value))
    env = {
        "PATH": f"{env_dir / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        **image_env,
        "CALLBRIDGE_CONFIG": str(config),
        "CALLBRIDGE_SERVER__HOST": "127.0.0.1",
        "CALLBRIDGE_SERVER__PORT": str(port),
    }
    (cmd,) = of(instructions, "CMD")
    with redis_server() as (redis_url, _):
        env["CALLBRIDGE_REGISTRY__REDIS_URL"] = redis_url  # the Deployment's env, from the Secret
        process = subprocess.Popen(json.loads(cmd), cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_http_ok(f"http://127.0.0.1:{port}/healthz", process, timeout_s=60)
        finally:
            process.terminate()
            _, stderr = process.communicate(timeout=60)
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(line.get("event") == "bridge_started" for line in lines), stderr[-3000:]
    assert "Traceback" not in stderr
    assert process.returncode == 0


def test_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (the test extra installs it on x86-64 Linux)")
    result = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
