"""callbridge's build: pure Python (the default), or with ``CALLBRIDGE_COMPILE=1`` its per-frame modules
(``callbridge/compiled.py``) compiled to C extensions by mypyc.

A compiled build type-checks those modules against the installed dependencies, so it runs without build
isolation, in an environment that has them and mypy (the ``test`` extra brings both)::

    pip install '.[test]'                                    # the dependencies and mypy
    pip install 'setuptools>=77'                             # the version pyproject.toml's metadata needs
    CALLBRIDGE_COMPILE=1 pip install --no-build-isolation --no-deps .

Everything else (metadata, dependencies, packages) is in ``pyproject.toml``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from setuptools import setup

ROOT = Path(__file__).parent


def compiled_module_files() -> list[str]:
    """The files ``callbridge/compiled.py`` lists, loaded from its file (the package is not importable yet)."""
    spec = importlib.util.spec_from_file_location("callbridge_compiled_list", ROOT / "callbridge" / "compiled.py")
    assert spec is not None and spec.loader is not None
    listed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(listed)
    files: list[str] = listed.compiled_files(ROOT)
    return files


def ext_modules() -> list[Any]:
    if os.environ.get("CALLBRIDGE_COMPILE") != "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        raise RuntimeError(
            "CALLBRIDGE_COMPILE=1 needs mypy (with mypyc) and callbridge's dependencies where it builds: "
            "install them, then build with pip install --no-build-isolation"
        ) from exc
    return list(mypycify(compiled_module_files(), opt_level="3"))


if __name__ == "__main__":  # as setuptools runs it; tests import compiled_module_files
    setup(ext_modules=ext_modules())
