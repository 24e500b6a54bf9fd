"""The CLI as a user runs it: the installed console script, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from callbridge import __version__
from callbridge.cli import main


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CALLBRIDGE_")}
    return subprocess.run(
        [sys.executable, "-m", "callbridge", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=60,
    )


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"callbridge {__version__}"


def test_help_lists_every_subcommand() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("serve", "engine-server", "simulate", "loadtest", "config"):
        assert command in result.stdout


def test_no_command_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage" in capsys.readouterr().err


def test_config_check_prints_effective_config_with_secrets_masked(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[server]\nport = 9001\n[plivo]\nauth_id = "MA123"\n')
    result = run_cli(
        "config", "check", "--config", str(path), "--set", "twilio.auth_token=tok-secret",
        env={"CALLBRIDGE_REGISTRY__REDIS_URL": "redis://:pw-secret@localhost:6379/0", "CALLBRIDGE_LOG__LEVEL": "debug"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "tok-secret" not in result.stdout and "pw-secret" not in result.stdout
    import tomllib

    shown = tomllib.loads(result.stdout)
    assert shown["server"]["port"] == 9001
    assert shown["plivo"]["auth_id"] == "MA123"
    assert shown["log"]["level"] == "debug"
    assert shown["twilio"]["auth_token"] == "********"
    assert shown["registry"]["redis_url"] == "********"
    assert "auth_token" not in shown["plivo"]  # unset: a comment


def test_config_check_json() -> None:
    result = run_cli("config", "check", "--format", "json", "--log-level", "warning")
    assert result.returncode == 0
    assert json.loads(result.stdout)["log"]["level"] == "warning"


def test_common_options_before_or_after_the_subcommand() -> None:
    before = run_cli("--set", "server.port=9005", "config", "check", "--format", "json")
    after = run_cli("config", "check", "--format", "json", "--set", "server.port=9005")
    assert json.loads(before.stdout)["server"]["port"] == json.loads(after.stdout)["server"]["port"] == 9005


@pytest.mark.parametrize(
    ("args", "env", "key"),
    [
        (["config", "check", "--set", "server.port=http"], {}, "server.port"),
        (["serve", "--port", "99999"], {}, "server.port"),
        (["config", "check"], {"CALLBRIDGE_ENGINE__KIND": "gpu"}, "engine.kind"),
        (["config", "check", "--set", "sip.nope=1"], {}, "sip.nope"),
        (["config", "check", "--config", "/nonexistent.toml"], {}, "/nonexistent.toml"),
        (["config", "check", "--set", "oops"], {}, "oops"),
    ],
)
def test_invalid_configuration_exit_2_one_clear_message(args: list[str], env: dict[str, str], key: str) -> None:
    result = run_cli(*args, env=env)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("callbridge: invalid configuration\n")
    assert f"  {key}: " in result.stderr


def test_simulate_places_a_call_and_writes_what_the_caller_heard(tmp_path: Path) -> None:
    import wave

    import numpy as np

    from callbridge.sim.runner import load_wav_8k, sample_caller_wav, write_wav_8k

    audio = tmp_path / "caller.wav"
    write_wav_8k(audio, load_wav_8k(sample_caller_wav())[: 1200 * 16])
    out = tmp_path / "heard.wav"
    result = run_cli("simulate", "--audio", str(audio), "--out", str(out), "--dtmf", "0.2:7")
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("stream MZ", "caller  speaks (1200 ms)", "caller  presses 7", "agent   starts speaking", "caller  hangs up"):
        assert line in result.stdout
    assert "protocol warnings: none" in result.stdout
    with wave.open(str(out)) as wav:
        assert wav.getframerate() == 8000 and wav.getnchannels() == 1
        heard = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    loud_ms = int((np.abs(heard.reshape(-1, 160)).max(axis=1) > 500).sum()) * 20
    assert 1000 <= loud_ms <= 2400  # the echo of the caller's 1.2 s


def test_simulate_with_a_missing_audio_file(tmp_path: Path) -> None:
    result = run_cli("simulate", "--audio", str(tmp_path / "nope.wav"))
    assert result.returncode == 2 and "nope.wav" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["simulate", "--dtmf", "5"], "--dtmf"),  # no time
        (["simulate", "--dtmf", "2:Z"], "--dtmf"),  # not a DTMF digit
        (["simulate", "--dtmf", "-1:5"], "--dtmf"),
        (["loadtest", "--calls", "0"], "--calls"),
        (["loadtest", "--calls", "many"], "--calls"),
    ],
)
def test_impossible_arguments_are_one_line_and_exit_2(args: list[str], names: str) -> None:
    """Before, ``--dtmf 5`` and ``--dtmf 2:Z`` were sent and hung up the call, and ``--calls 0`` ran and exited 0."""
    result = run_cli(*args)
    assert result.returncode == 2 and names in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("callbridge ") and result.stdout == ""


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "empty or cut short"),
        (b"this is not a wav file at all", "RIFF"),
        (b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x07\x00\x01\x00@\x1f\x00\x00@\x1f\x00\x00\x01\x00\x08\x00data\x00\x00\x00\x00", "unknown format: 7"),
    ],
)
def test_simulate_with_audio_that_is_not_pcm_wav(tmp_path: Path, content: bytes, says: str) -> None:
    """Before: a ``wave.Error`` traceback (μ-law, not RIFF), or ``callbridge simulate: `` and nothing (empty)."""
    audio = tmp_path / "caller.wav"
    audio.write_bytes(content)
    result = run_cli("simulate", "--audio", str(audio))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"--audio {audio}: " in result.stderr and says in result.stderr and "16-bit PCM WAV" in result.stderr


def test_simulate_with_a_wav_that_holds_no_audio(tmp_path: Path) -> None:
    """Before: a silent 30 s call, then exit 1."""
    import wave

    audio = tmp_path / "empty.wav"
    with wave.open(str(audio), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(8000)
    result = run_cli("simulate", "--audio", str(audio))
    assert result.returncode == 2 and "holds no audio" in result.stderr and "Traceback" not in result.stderr


def test_simulate_offers_every_simulated_carrier() -> None:
    from callbridge.cli import SIMULATED_CARRIERS
    from callbridge.sim.carriers import SIMULATED

    assert sorted(SIMULATED_CARRIERS) == sorted(SIMULATED)
