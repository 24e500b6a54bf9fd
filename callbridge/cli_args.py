"""What the ``callbridge`` command's subcommands share: argument types (times, key presses, counts), the checks made
before a run starts (the application loads, a file can be written, the caller's audio reads), and how a
configuration error is printed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final, TextIO

from callbridge.carriers import carrier_spec
from callbridge.config import ConfigError, ConfigProblem, Settings

__all__ = [
    "EXIT_USAGE",
    "app_loads",
    "at_least_one",
    "at_or_after_start",
    "caller_audio",
    "can_write",
    "key_press",
    "outbound_runs",
    "print_config_error",
    "reconnects",
    "seconds_above_zero",
]

EXIT_USAGE: Final = 2
"""Invalid usage or configuration."""


def print_config_error(exc: ConfigError, stream: TextIO) -> None:
    """One line per problem, each naming its key (or file)."""
    for problem in exc.problems:
        print(f"callbridge: invalid configuration: {problem.key}: {problem.problem}", file=stream)


def app_loads(settings: Settings) -> bool:
    """``app.module`` imports and has its hook (checked before anything starts); else one line naming it."""
    if settings.app.module is None:
        return True
    from callbridge.application.hooks import load_module

    try:
        load_module(settings.app.module)
    except ValueError as exc:
        print_config_error(ConfigError([ConfigProblem(key="app.module", problem=str(exc))]), sys.stderr)
        return False
    return True


def outbound_runs(args: argparse.Namespace) -> bool:
    """``loadtest --outbound`` can run: a bridge in this process (no ``--url``), and a carrier whose simulator takes
    the bridge's dials; else why not, on stderr."""
    from callbridge.sim.simulators import simulator_class

    if args.url or not getattr(simulator_class(carrier_spec(args.provider)), "places_calls", False):
        print(f"callbridge loadtest: --outbound needs a bridge in this process (no --url) and a carrier it dials ({args.provider} is not one yet)", file=sys.stderr)
        return False
    return True


def reconnects(provider: str) -> bool:
    """Whether the carrier opens a new media connection on the same call after a drop (SIP has no such thing: a
    call whose media is gone is over)."""
    return carrier_spec(provider).capabilities.reconnect


_DIGITS: Final = "0123456789*#ABCD"


def key_press(value: str) -> tuple[int, str]:
    """``--dtmf S:DIGIT`` as (ms into the call, on the 20 ms grid; the digit)."""
    at, sep, digit = value.partition(":")
    try:
        seconds = float(at)
    except ValueError:
        seconds = -1.0
    if not sep or seconds < 0 or len(digit) != 1 or digit.upper() not in _DIGITS:
        raise argparse.ArgumentTypeError(f"{value!r}: give S:DIGIT, S seconds into the call (0 or more), DIGIT one of {_DIGITS}")
    return int(seconds * 1000) // 20 * 20, digit.upper()


def seconds(value: str, *, zero: bool) -> float:
    import math

    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and (seconds >= 0 if zero else seconds > 0)):
        raise argparse.ArgumentTypeError(f"{value!r}: seconds, {'0 or more' if zero else 'more than 0'}")
    return seconds


def at_or_after_start(value: str) -> float:
    """A time into the call (or a ramp): seconds, 0 or more."""
    return seconds(value, zero=True)


def seconds_above_zero(value: str) -> float:
    """A duration or period: seconds, more than 0."""
    return seconds(value, zero=False)


def at_least_one(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: a whole number, 1 or more")
    return number


def caller_audio(args: argparse.Namespace, path: Path) -> bytes | None:
    """``--audio``'s speech as 8 kHz PCM16, or None after one line saying why it cannot be (not a 16-bit PCM WAV,
    unreadable, no audio)."""
    import wave

    from callbridge.sim.runner import load_wav_8k

    try:
        speech = load_wav_8k(path)
    except (OSError, ValueError, EOFError, wave.Error) as exc:
        detail = str(exc).removeprefix(f"{path}: ") or "empty or cut short"
        print(f"callbridge {args.command}: --audio {path}: {detail} (a 16-bit PCM WAV is needed)", file=sys.stderr)
        return None
    if not speech:
        print(f"callbridge {args.command}: --audio {path}: the WAV holds no audio", file=sys.stderr)
        return None
    return speech


def can_write(args: argparse.Namespace, option: str) -> bool:
    """Whether the file ``--option`` names can be written, checked before the run (not found out after it);
    False after one line saying why not."""
    import os

    path: Path | None = getattr(args, option)
    if path is None:
        return True
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        problem = "is a directory: give a file name"
    elif not folder.is_dir():
        problem = f"the folder {folder} does not exist: create it, or give another path"
    elif not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        problem = "cannot be written here (permission denied): give another path"
    else:
        return True
    print(f"callbridge {args.command}: --{option} {path}: {problem}", file=sys.stderr)
    return False
