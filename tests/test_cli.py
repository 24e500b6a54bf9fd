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
    assert "auth_token" not in shown["twilio"] and "# auth_token is set (a secret, not shown)" in result.stdout
    assert "redis_url" not in shown["registry"]
    assert "auth_token" not in shown["plivo"]  # unset: a comment


def test_config_check_writes_toml_that_loads_back_as_the_same_settings(tmp_path: Path) -> None:
    """Its output is a config file: read back (the secrets given again, as env vars), the same settings. Before, the
    hand-rolled writer wrote ``[[sip.registrations]]`` as a quoted Python repr, which no TOML reader took."""
    from callbridge.config import load_settings

    config = tmp_path / "in.toml"
    config.write_text(
        '[sip]\nenabled = true\nallowed_ips = ["10.0.0.0/8"]\n'
        '[[sip.registrations]]\nregistrar = "sip:pbx.example.com"\naor = "sip:100@pbx.example.com"\npassword = "pw-secret"\n'
        '[[sip.registrations]]\nregistrar = "sip:trunk.example.com:5080"\naor = "sip:bot@trunk.example.com"\n'
        'transport = "tcp"\nexpires_s = 600\n'
        '[engine]\nkind = "realtime"\nurls = ["ws://gpu-1:8091", "wss://gpu-2"]\ninstructions = "Say \\"hi\\"\\n\\tthen wait"\n'
        '[call_actions]\nenabled = true\ntransfer_targets = ["+15550100", "sip:desk@pbx.example.com"]\n'
        '[server]\nmax_calls_fleet = 50\n'
    )
    secrets = {"CALLBRIDGE_REGISTRY__REDIS_URL": "redis://:pw@127.0.0.1:6379/0", "CALLBRIDGE_TWILIO__AUTH_TOKEN": "tw-secret"}
    result = run_cli("config", "check", "--config", str(config), "--set", "registry.backend=redis", env=secrets)
    assert result.returncode == 0, result.stderr
    assert "pw-secret" not in result.stdout and "tw-secret" not in result.stdout
    written = tmp_path / "out.toml"
    written.write_text(result.stdout)
    original = load_settings(config, {"registry": {"backend": "redis", "redis_url": secrets["CALLBRIDGE_REGISTRY__REDIS_URL"]}})
    read_back = load_settings(written, {"registry": {"redis_url": secrets["CALLBRIDGE_REGISTRY__REDIS_URL"]}})
    assert read_back.sip.registrations[0].password is None  # a secret: not written, given again where it lives
    restored = read_back.model_copy(
        update={"sip": read_back.sip.model_copy(update={"registrations": [
            read_back.sip.registrations[0].model_copy(update={"password": original.sip.registrations[0].password}),
            read_back.sip.registrations[1],
        ]}), "twilio": original.twilio},
    )  # fmt: skip
    assert restored.model_dump() == original.model_dump()


def test_config_check_json() -> None:
    result = run_cli("config", "check", "--format", "json", "--log-level", "warning")
    assert result.returncode == 0
    assert json.loads(result.stdout)["log"]["level"] == "warning"


def test_common_options_before_or_after_the_subcommand() -> None:
    before = run_cli("--set", "server.port=9005", "config", "check", "--format", "json")
    after = run_cli("config", "check", "--format", "json", "--set", "server.port=9005")
    assert json.loads(before.stdout)["server"]["port"] == json.loads(after.stdout)["server"]["port"] == 9005


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


@pytest.mark.parametrize(
    ("provider", "callee", "heard"),
    [("twilio", "person", "agent   starts speaking"), ("twilio", "voicemail", "call.voicemail_left"), ("twilio", "busy", "call.failed"),
     ("sip", "person", "agent   starts speaking"), ("sip", "busy", "486 Busy Here")],
)  # fmt: skip
def test_simulate_outbound_places_a_call_to_a_person_a_voicemail_or_a_busy_line(tmp_path: Path, provider: str, callee: str, heard: str) -> None:
    """``simulate --outbound --callee …``: the agent places the call (``POST /calls`` on the bridge in the process);
    a person hears the agent after their hello, a voicemail gets the message after its beep, a busy line fails —
    through Twilio's REST dial, and through the SIP trunk (the simulated trunk answering the bridge's INVITE)."""
    out = tmp_path / "heard.wav"
    hangup = ["--hangup-at", "4"] if callee == "person" else []  # a voicemail records until the bridge hangs up
    result = run_cli(
        "simulate", "--outbound", "--provider", provider, "--callee", callee, "--app", "examples.agent:app", "--out", str(out), *hangup
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "POST /calls → {'dial_id'" in result.stdout and heard in result.stdout, result.stdout
    assert callee == "busy" or out.exists()


def test_simulate_offers_every_simulated_carrier() -> None:
    """The registry's simulated carriers are what ``--provider`` offers, each its own simulator; reading the
    registry for ``--help`` imports no carrier's HTTP side or simulator."""
    script = (
        "import sys; from callbridge.cli import _build_parser; _build_parser(); "
        "print(sorted(m for m in sys.modules if m.startswith('callbridge.carriers.') and m.count('.') > 2 and not m.endswith('.settings')))"
    )
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", loaded  # only the packages' specs (and settings sections), no wire/http/sim module
    from callbridge.cli import main
    from callbridge.sim.simulators import simulated

    for command in ("simulate", "loadtest"):
        with pytest.raises(SystemExit):
            main([command, "--provider", "nope"])
    for name, simulator in simulated().items():
        assert simulator.provider == name
    assert sorted(simulated()) == ["audiosocket", "bandwidth", "exotel", "jambonz", "plivo", "signalwire", "sip", "telnyx", "twilio", "vonage"]
