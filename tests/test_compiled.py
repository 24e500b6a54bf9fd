"""The compiled build's module list (``callbridge/compiled.py``, read by ``setup.py``) and what the bridge can tell
of the build it runs: all of the list compiled or none, and a compiled module edited since its build."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from callbridge.compiled import COMPILED_MODULES, compiled_files, compiled_modules, stale_modules

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parent.parent


def test_setup_compiles_the_files_of_the_listed_modules() -> None:
    spec = importlib.util.spec_from_file_location("callbridge_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)  # not as __main__: setup() does not run
    files = setup.compiled_module_files()
    assert files == compiled_files() == [name.replace(".", "/") + ".py" for name in COMPILED_MODULES]
    assert all((ROOT / file).is_file() for file in files)
    # the whole way of a frame: the call, its ledger, a carrier's codec and its base, the resamplers, the engine core
    for name in ("bridge.call", "bridge.agent_speech", "bridge.caller_audio", "bridge.playout", "carriers.twilio.wire", "carriers.json_wire", "codecs.lowdelay", "engine.local.core"):
        assert f"callbridge.{name}" in COMPILED_MODULES
    carriers = [name for name in COMPILED_MODULES if name.startswith("callbridge.carriers.") and name.endswith(".wire")]
    assert len(carriers) == len(list((ROOT / "callbridge" / "carriers").glob("*/wire.py")))


def test_the_build_is_compiled_whole_or_not_at_all() -> None:
    """CI's second pass runs the suite on a compiled tree with ``CALLBRIDGE_EXPECT_COMPILED=1``: there every listed
    module must be the compiled one (a pure-Python module there would test nothing new). A partial build is never
    right: a module that failed to compile would be the one untested."""
    compiled = compiled_modules()
    if os.environ.get("CALLBRIDGE_EXPECT_COMPILED") == "1":
        assert compiled == list(COMPILED_MODULES)
        assert stale_modules() == []
        assert str(sys.modules["callbridge.bridge.call"].__file__).endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    else:
        assert compiled in ([], list(COMPILED_MODULES))


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``fakepkg`` on the path, empty."""
    root = tmp_path / "fakepkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [name for name in sys.modules if name.startswith("fakepkg")]:
        del sys.modules[name]


def test_a_compiled_module_edited_since_its_build_is_stale(package: Path) -> None:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (package / f"built{suffix}").write_bytes(b"")  # found, never loaded
    (package / f"edited{suffix}").write_bytes(b"")
    (package / "built.py").write_text("")
    (package / "edited.py").write_text("")
    (package / "plain.py").write_text("")
    old, new = 1_700_000_000, 1_700_000_100
    for name, when in (("built.py", old), (f"built{suffix}", new), (f"edited{suffix}", old), ("edited.py", new)):
        os.utime(package / name, (when, when))
    names = ("fakepkg.built", "fakepkg.edited", "fakepkg.plain", "fakepkg.missing")
    assert compiled_modules(names) == ["fakepkg.built", "fakepkg.edited"]
    assert stale_modules(names) == ["fakepkg.edited"]


def test_a_compiled_install_is_never_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip writes an installed wheel's files as it goes: a source beside its extension can be the newer by a few
    ms (the Docker image's was). Only a tree one builds in place can be edited since its build."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    root = tmp_path / "lib" / "python3" / "site-packages" / "fakeinstalled"
    root.mkdir(parents=True)
    for name in ("__init__.py", f"mod{suffix}", "mod.py"):
        (root / name).write_bytes(b"")
    os.utime(root / f"mod{suffix}", (1_700_000_000, 1_700_000_000))
    monkeypatch.syspath_prepend(str(root.parent))
    try:
        assert compiled_modules(("fakeinstalled.mod",)) == ["fakeinstalled.mod"]
        assert stale_modules(("fakeinstalled.mod",)) == []
    finally:
        for name in [name for name in sys.modules if name.startswith("fakeinstalled")]:
            del sys.modules[name]
