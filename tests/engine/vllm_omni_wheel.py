"""vllm-omni 0.30.0's pure protocol modules, loaded from its wheel, to check our wire code against.

``import vllm_omni`` needs torch and vllm; its protocol, command and event
modules do not (reference §4.6). This loads them from the wheel under stub
parent packages, with ``vllm.logger`` and ``pybase64`` stood in by the
standard library (they only log and base64-encode there).

The wheel: ``$CALLBRIDGE_VLLM_OMNI_WHEEL``, else ``.cache/wheels/vllm_omni-0.30.0-*.whl``
(``.ci/run`` downloads it: ``pip download --no-deps vllm-omni==0.30.0 -d .cache/wheels``).
Without it the tests that need it skip, unless ``CALLBRIDGE_REQUIRE_VLLM_OMNI_WHEEL=1`` (CI).
"""

from __future__ import annotations

import base64
import functools
import logging
import os
import sys
import tempfile
import types
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
_STUB_PACKAGES = ("vllm_omni", "vllm_omni.engine", "vllm_omni.engine.duplex", "vllm_omni.utils", "vllm_omni.entrypoints")


def wheel_path() -> Path | None:
    explicit = os.environ.get("CALLBRIDGE_VLLM_OMNI_WHEEL")
    if explicit:
        return Path(explicit)
    found = sorted((ROOT / ".cache" / "wheels").glob("vllm_omni-0.30.0-*.whl"))
    return found[-1] if found else None


def require_wheel() -> Path:
    """The wheel's path; the calling test skips without it, unless CI requires it."""
    wheel = wheel_path()
    if wheel is None or not wheel.exists():
        if os.environ.get("CALLBRIDGE_REQUIRE_VLLM_OMNI_WHEEL") == "1":
            raise AssertionError("the vllm-omni 0.30.0 wheel is required here; see tests/engine/vllm_omni_wheel.py")
        pytest.skip("vllm-omni 0.30.0 wheel not downloaded (pip download --no-deps vllm-omni==0.30.0 -d .cache/wheels)")
    return wheel


@functools.cache
def _extract(wheel: Path) -> Path:
    target = Path(tempfile.mkdtemp(prefix="vllm_omni_0_30_"))
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if n.startswith(("vllm_omni/protocol/", "vllm_omni/engine/duplex/", "vllm_omni/utils/"))]
        archive.extractall(target, members)
    return target / "vllm_omni"


def load_vllm_omni() -> None:
    """Make ``vllm_omni.protocol`` and ``vllm_omni.engine.duplex.{commands,events,config}`` importable, or skip."""
    if "vllm_omni.engine.duplex.commands" in sys.modules:
        return
    root = _extract(require_wheel())
    for name in _STUB_PACKAGES:
        module = types.ModuleType(name)
        module.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules.setdefault(name, module)
    vllm = types.ModuleType("vllm")
    vllm.__path__ = []
    vllm_logger = types.ModuleType("vllm.logger")
    vllm_logger.init_logger = logging.getLogger  # type: ignore[attr-defined]
    sys.modules.setdefault("vllm", vllm)
    sys.modules.setdefault("vllm.logger", vllm_logger)
    sys.modules.setdefault("pybase64", base64)


@pytest.fixture
def vllm_omni() -> None:
    load_vllm_omni()
