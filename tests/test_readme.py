"""The docs stay true: the engine page's client example (``docs/engine.md``) holds a spoken exchange with a real
``engine-server``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import free_port, wait_http_ok

ROOT = Path(__file__).resolve().parent.parent


def test_engine_client_example_talks_to_engine_server() -> None:
    page = (ROOT / "docs" / "engine.md").read_text()
    match = re.search(r"<!-- engine-client-example -->\n```python\n(.*?)```", page, re.DOTALL)
    assert match, "docs/engine.md lost its engine client example"
    port = free_port()
    code = match.group(1).replace("ws://127.0.0.1:8091", f"ws://127.0.0.1:{port}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLBRIDGE_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "callbridge", "engine-server", "--port", str(port), "--log-format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", server)
        result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
        assert result.returncode == 0, result.stderr
        said_ms = int(re.search(r"the agent said (\d+) ms back", result.stdout).group(1))  # type: ignore[union-attr]
        assert 3500 <= said_ms <= 4800  # the caller's utterance, echoed
    finally:
        server.terminate()
        assert server.wait(timeout=15) == 0
