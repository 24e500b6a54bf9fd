"""Which modules a compiled build compiles with mypyc, and whether this process runs them compiled.

Why: every frame of every call goes through these modules (the driver, the call core, the playout ledger, the
carriers' wire codecs, the resamplers, the embedded engine), and the interpreter's own work is most of what a frame
costs (``bench/RESULTS.md``). They are already ``mypy --strict``; mypyc turns them into C extensions that run the
same code with less of it (a third less CPU per call-second in ``bench/driver_cpu.py``), doing the same things.

A build compiles them only when asked (``CALLBRIDGE_COMPILE=1``, ``setup.py``): the default install stays pure
Python, so the quick start needs no C compiler and an edited module is always the one that runs. A compiled
module whose source has changed since it was built would run the old code: ``stale_modules`` names them, and the
bridge warns at start-up.

Kept free of the package's imports: ``setup.py`` loads this file on its own, before anything is installed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from typing import Final

__all__ = ["COMPILED_FILES", "COMPILED_MODULES", "compiled_files", "compiled_modules", "stale_modules"]

COMPILED_FILES: tuple[str, ...] = (
    "callbridge/bridge/agent_actions.py",
    "callbridge/bridge/agent_audio.py",
    "callbridge/bridge/agent_speech.py",
    "callbridge/bridge/agent_turns.py",
    "callbridge/bridge/binding.py",
    "callbridge/bridge/call.py",
    "callbridge/bridge/call_options.py",
    "callbridge/bridge/call_outputs.py",
    "callbridge/bridge/call_state.py",
    "callbridge/bridge/caller_audio.py",
    "callbridge/bridge/carrier_link.py",
    "callbridge/bridge/heard.py",
    "callbridge/bridge/inbound.py",
    "callbridge/bridge/limits.py",
    "callbridge/bridge/media.py",
    "callbridge/bridge/pacing.py",
    "callbridge/bridge/playout.py",
    "callbridge/bridge/stream_phase.py",
    "callbridge/bridge/turns.py",
    "callbridge/carriers/base.py",
    "callbridge/carriers/json_wire.py",
    "callbridge/carriers/*/wire.py",
    "callbridge/codecs/framing.py",
    "callbridge/codecs/g711.py",
    "callbridge/codecs/lowdelay.py",
    "callbridge/codecs/resample.py",
    "callbridge/engine/commands.py",
    "callbridge/engine/events.py",
    "callbridge/engine/late_audio.py",
    "callbridge/engine/local/core.py",
    "callbridge/engine/wire.py",
)
"""The per-frame modules' files, from the directory that holds the package: the call core (and its parts) and its driver, the
ledger and the pacing clock, every carrier's codec (they subclass each other's bases, and a compiled class cannot
have an interpreted subclass) with the events they make, the audio codecs, the engine's commands and events, the
engine wire's codec (vllm-omni's protocol) and the embedded engine's core. Not ``engine/event_stream.py`` (mypyc
does not compile async generators), nor the embedded engine's session wrapper (tests subclass it)."""

ROOT = Path(__file__).resolve().parent.parent
"""The directory that holds the ``callbridge`` package (a checkout, or site-packages)."""


def compiled_files(root: Path = ROOT) -> list[str]:
    """``COMPILED_FILES`` with their patterns expanded, relative to ``root``, sorted."""
    return sorted({str(path.relative_to(root)) for pattern in COMPILED_FILES for path in root.glob(pattern)})


COMPILED_MODULES: tuple[str, ...] = tuple(file.removesuffix(".py").replace("/", ".") for file in compiled_files())
"""The per-frame modules, by name."""

_EXTENSION_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def _origin(name: str) -> str:
    """The file ``name`` imports from (its parent packages are imported to find it; the module itself is not)."""
    spec = importlib.util.find_spec(name)
    return "" if spec is None or spec.origin is None else spec.origin


def compiled_modules(names: tuple[str, ...] = COMPILED_MODULES) -> list[str]:
    """Those of ``names`` that import from a compiled extension here."""
    return [name for name in names if _origin(name).endswith(_EXTENSION_SUFFIXES)]


_INSTALLED: Final = frozenset({"site-packages", "dist-packages"})


def stale_modules(names: tuple[str, ...] = COMPILED_MODULES) -> list[str]:
    """Compiled modules whose source file beside them is newer than the extension: an edit since the build, which
    does not run. Not where pip installed them: it writes a wheel's files in any order, each as it goes (the
    sources beside a compiled install — the Docker image — are newer than their extensions by milliseconds)."""
    stale = []
    for name in compiled_modules(names):
        extension = Path(_origin(name))
        if _INSTALLED.intersection(extension.parts):
            continue
        source = extension.with_name(extension.name.split(".", 1)[0] + ".py")
        if source.exists() and source.stat().st_mtime > extension.stat().st_mtime:
            stale.append(name)
    return stale
