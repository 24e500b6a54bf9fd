"""The package type-checks under ``mypy --strict`` (configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.long
@pytest.mark.timeout(600)  # a cold mypy run beside eleven busy workers took over the suite's 120 s on a 2-core machine
def test_mypy_strict() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
