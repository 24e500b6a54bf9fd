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

from callbridge.compiled import COMPILED_MODULES, compiled_modules
from callbridge.config import Settings
from tests.conftest import ServedBridge, free_port, wait_http_ok
from tests.redis_server import redis_server

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def stages() -> list[list[dict[str, str]]]:
    """The Dockerfile's stages, each its instructions from its ``FROM``: the build, then the image."""
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    found: list[list[dict[str, str]]] = []
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            found.append([])
        if found:
            found[-1].append(instruction)
    return found


@pytest.fixture(scope="module")
def instructions(stages: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """The image's own stage (the last)."""
    return stages[-1]


def of(instructions: list[dict[str, str]], name: str) -> list[str]:
    return [i["value"] for i in instructions if i["instruction"] == name]


def test_slim_python_bases(stages: list[list[dict[str, str]]]) -> None:
    assert len(stages) == 2
    build, image = (of(stage, "FROM")[0] for stage in stages)
    assert build == "python:3.11-slim AS build" and image == "python:3.11-slim"  # the same Python: its extensions load


def test_runs_as_non_root_before_the_command(instructions: list[dict[str, str]]) -> None:
    names = [i["instruction"] for i in instructions]
    users = of(instructions, "USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert names.index("USER") < names.index("CMD")


def pip_steps(instructions: list[dict[str, str]]) -> list[str]:
    """The stage's ``RUN`` steps that run pip, each a shell command."""
    return [run.replace("\\\n", " ") for run in of(instructions, "RUN") if "pip " in run]


def test_the_build_stage_compiles_and_the_image_installs_only_its_wheels(stages: list[list[dict[str, str]]]) -> None:
    """The image runs the compiled build (docs/development.md, "The compiled build"): the build stage makes the wheels with
    ``CALLBRIDGE_COMPILE=1``; the image installs from them alone, with the fleet's extra, and serves."""
    build, image = stages
    (building,) = pip_steps(build)
    assert "CALLBRIDGE_COMPILE=1 pip wheel" in building and "--no-build-isolation" in building and '".[redis]"' in building
    (installing,) = pip_steps(image)
    command = shlex.split(installing.split("&&")[0])
    assert command[:2] == ["pip", "install"] and "--no-index" in command and "callbridge[redis]" in command
    assert "--from=build /wheels /wheels" in of(image, "COPY")
    (cmd,) = of(image, "CMD")
    assert json.loads(cmd) == ["callbridge", "serve"]
    for stage in stages:
        for copy in of(stage, "COPY"):
            if not copy.startswith("--from="):
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


def _copy_sources(stage: list[dict[str, str]], into: Path) -> None:
    """What a stage ``COPY``s from the checkout, into ``into`` (its ``WORKDIR``)."""
    for copy in of(stage, "COPY"):
        if copy.startswith("--from="):
            continue
        for source in copy.split()[:-1]:
            origin = ROOT / source
            if origin.is_dir():
                shutil.copytree(origin, into / source, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            else:
                shutil.copy(origin, into / source)


def _run_pip_steps(stage: list[dict[str, str]], venv_dir: Path, cwd: Path, wheels: Path) -> None:
    """A stage's pip steps as its ``RUN`` has them, with the venv's ``pip`` and ``wheels`` for ``/wheels``; pip's
    cache allowed (``--no-cache-dir`` keeps the image small; here it would only download everything again)."""
    env = {**os.environ, "PATH": f"{venv_dir / 'bin'}:{os.environ['PATH']}", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)  # not the compiled checkout CI's second pass imports: the build's own
    for step in pip_steps(stage):
        command = step.replace("/wheels", str(wheels)).replace("--no-cache-dir", "")
        ran = subprocess.run(["bash", "-euc", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
        assert ran.returncode == 0, (command, ran.stdout[-2000:], ran.stderr[-3000:])


@pytest.mark.image
@pytest.mark.timeout(1500)  # a fresh venv's install, then mypyc over the listed modules: minutes on 2 cores
@pytest.mark.skipif(bool(compiled_modules()), reason="CI's first pass builds the image's way once: the same build")
def test_the_images_build_compiles_and_serves_the_kubernetes_configmap(
    stages: list[list[dict[str, str]]], tmp_path: Path
) -> None:
    """The image's two stages in fresh venvs (no Docker here), each from a copy of what it COPYs: the build stage's
    pip steps (its compiler is this machine's) make the wheels, the image's installs from them alone; then
    ``callbridge serve`` on the ConfigMap's TOML with the image's env: the fleet as shipped starts, every listed
    module compiled (before, the install lacked the redis client and ``serve`` died with ModuleNotFoundError)."""
    import venv

    import yaml

    if shutil.which("gcc") is None:
        pytest.skip("no C compiler: the image's build stage installs gcc (apt-get install gcc libc6-dev)")
    build, image = stages
    wheels, src, app = tmp_path / "wheels", tmp_path / "src", tmp_path / "app"
    for directory in (src, app):
        directory.mkdir()
    _copy_sources(build, src)
    _copy_sources(image, app)
    build_venv, env_dir = tmp_path / "build-venv", tmp_path / "venv"
    for directory in (build_venv, env_dir):
        venv.EnvBuilder(with_pip=True).create(directory)
    _run_pip_steps(build, build_venv, src, wheels)
    assert any(wheel.name.startswith("callbridge-") and "-cp3" in wheel.name for wheel in wheels.iterdir())  # not py3-none-any
    _run_pip_steps(image, env_dir, app, wheels)

    (configmap,) = [d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/configmap.yaml").read_text()) if d]
    config = tmp_path / "callbridge.toml"
    config.write_text(configmap["data"]["callbridge.toml"])
    port = free_port()
    image_env = dict(part.split("=", 1) for value in of(image, "ENV") for part in shlex.split(value))
    env = {
        "PATH": f"{env_dir / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        **image_env,
        "CALLBRIDGE_CONFIG": str(config),
        "CALLBRIDGE_SERVER__HOST": "127.0.0.1",
        "CALLBRIDGE_SERVER__PORT": str(port),
    }
    (cmd,) = of(image, "CMD")
    with redis_server() as (redis_url, _):
        env["CALLBRIDGE_REGISTRY__REDIS_URL"] = redis_url  # the Deployment's env, from the Secret
        process = subprocess.Popen(json.loads(cmd), cwd=app, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_http_ok(f"http://127.0.0.1:{port}/healthz", process, timeout_s=60)
        finally:
            process.terminate()
            _, stderr = process.communicate(timeout=60)
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    started = [line for line in lines if line.get("event") == "bridge_started"]
    assert started and started[0]["compiled"] == f"{len(COMPILED_MODULES)}/{len(COMPILED_MODULES)}", stderr[-3000:]
    assert "compiled_modules_stale" not in stderr and "Traceback" not in stderr
    assert process.returncode == 0


def test_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (the test extra installs it on x86-64 Linux)")
    result = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
