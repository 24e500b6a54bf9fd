"""The test run's bytecode made once, before the workers start (``tests/conftest.py``).

Each of the 12 xdist workers imports every test module, and pytest rewrites each one's asserts and compiles it
again — 5 of the 7 CPU-seconds a worker spent collecting on this project's 2-core machine (``python -m pytest
--collect-only -n 0``: 7.3 s of CPU cold, 2.2 s with the rewritten modules cached), a minute of CPU before the first
test ran. Where ``PYTHONDONTWRITEBYTECODE`` is set, or on a fresh clone, nothing is cached and every run pays it. So
the controller compiles the package and the tests (``compileall``) and rewrites the test modules into pytest's own
cache (the ``__pycache__`` folders git ignores), and the workers read them. Pytest's rewriting API is private: where
it differs (another pytest), nothing is cached and the run goes on as before.
"""

from __future__ import annotations

import compileall
from pathlib import Path

import pytest

__all__ = ["cache_bytecode"]

ROOT = Path(__file__).resolve().parent.parent


def cache_bytecode(config: pytest.Config) -> None:
    """Compile ``callbridge`` and ``tests``, and rewrite the test modules into pytest's cache (see the module)."""
    for folder in ("callbridge", "tests"):
        compileall.compile_dir(ROOT / folder, quiet=2)
    try:
        from _pytest.assertion import rewrite
        from _pytest.assertion.rewrite import assertstate_key

        state = config.stash[assertstate_key]
        for module in sorted((ROOT / "tests").rglob("*.py")):
            if not (module.name.startswith("test_") or module.name == "conftest.py"):
                continue
            pyc = rewrite.get_cache_dir(module) / (module.name[:-3] + rewrite.PYC_TAIL)
            if rewrite._read_pyc(module, pyc) is None:
                pyc.parent.mkdir(exist_ok=True)
                source_hash, code = rewrite._rewrite_test(module, config)
                rewrite._write_pyc(state, code, source_hash, pyc)
    except (ImportError, AttributeError, KeyError, TypeError, OSError):
        return  # another pytest's internals, or a folder that cannot be written: the workers rewrite, as before
