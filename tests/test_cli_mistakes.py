"""Every user's mistake the CLI can meet, one row each: the installed command in a subprocess, as a user runs it.

Each gets one line on stderr that names the setting, option or file, says what is wrong and what to do, and a
documented exit code (2: usage or configuration, 3: a listener's address cannot be had, 1: the run failed): never
a traceback, never a run that goes ahead and fails later (a whole load test, then the PNG's folder is missing).
Rows hold ``{tmp}`` (a folder of this test), ``{held_tcp}`` / ``{held_udp}`` (a port another socket holds),
``{free}`` and ``{free2}`` (ports nothing listens on).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme

from callbridge.sim.runner import free_port

pytestmark = pytest.mark.background

_MULAW_WAV = (
    b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x07\x00\x01\x00@\x1f\x00\x00@\x1f\x00\x00\x01\x00\x08\x00"
    b"data\x00\x00\x00\x00"
)

_BLOCK_EXTRAS = """
import importlib.abc, sys
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in ('redis', 'vllm_omni'):
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
sys.argv[0] = 'callbridge'
from callbridge.cli import run
run()
"""
"""Runs the CLI as if the ``redis`` and ``omni`` extras were not installed."""


@dataclass(frozen=True)
class Mistake:
    name: str
    args: tuple[str, ...]
    code: int
    says: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    without_extras: bool = False


def _header_only_wav() -> bytes:
    import io

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(8000)
    return buffer.getvalue()


def _tls_pair() -> dict[str, bytes]:
    """A certificate and its key for SIP over TLS (a test CA's), as files of the mistake's folder."""
    leaf = trustme.CA().issue_cert("127.0.0.1")
    return {"sip.crt": leaf.cert_chain_pems[0].bytes(), "sip.key": leaf.private_key_pem.bytes()}


_TLS_PAIR = _tls_pair()

MISTAKES = [
    # Configuration: the key, what is wrong (the value given, unless it is a secret).
    Mistake("port out of range", ("serve", "--port", "99999"), 2, ("server.port", "65535", "'99999'")),
    Mistake("port not a number", ("config", "check", "--set", "server.port=http"), 2, ("server.port", "'http'")),
    Mistake("unknown value from env", ("config", "check"), 2, ("engine.kind", "'gpu'"), env={"CALLBRIDGE_ENGINE__KIND": "gpu"}),
    Mistake("unknown key", ("config", "check", "--set", "sip.nope=1"), 2, ("sip.nope", "unknown key")),
    Mistake("--set without =", ("config", "check", "--set", "oops"), 2, ("oops", "section.key=value")),
    Mistake("config file missing", ("config", "check", "--config", "{tmp}/nope.toml"), 2, ("nope.toml", "not found")),
    Mistake("config file is a folder", ("config", "check", "--config", "{tmp}"), 2, ("is a directory",)),
    Mistake("config file not TOML", ("config", "check", "--config", "{tmp}/bad.toml"), 2, ("bad.toml", "invalid TOML"), files={"bad.toml": b"[server\nport = 1\n"}),
    Mistake("realtime engine without urls", ("serve", "--set", "engine.kind=realtime"), 2, ("engine.urls", "ws://host:port")),
    Mistake("engine url over http", ("config", "check", "--set", "engine.urls=[http://gpu:8091]"), 2, ("engine.urls.0", "ws://", "'http://gpu:8091'")),
    Mistake("engine url without scheme", ("config", "check", "--set", "engine.urls=[notaurl]"), 2, ("engine.urls.0", "ws://", "'notaurl'")),
    Mistake("engine url port not a number", ("config", "check", "--set", 'engine.urls=["ws://gpu:http"]'), 2, ("engine.urls.0", "not a URL")),
    Mistake("engine urls from env not a list", ("config", "check"), 2, ("engine.urls.0", "ws://"), env={"CALLBRIDGE_ENGINE__URLS": "[gpu-1:8091]"}),
    Mistake("public url without scheme", ("config", "check", "--set", "server.public_url=bridge.example.com"), 2, ("server.public_url", "https://")),
    Mistake("api base url not http", ("config", "check", "--set", "twilio.api_base_url=ftp://x"), 2, ("twilio.api_base_url", "https://")),
    Mistake(
        "redis url not redis", ("config", "check", "--set", "registry.backend=redis", "--set", "registry.redis_url=http://cache:6379"),
        2, ("registry.redis_url", "redis://"),
    ),  # fmt: skip
    Mistake("vonage key missing", ("config", "check", "--set", "vonage.private_key_path={tmp}/private.key"), 2, ("vonage.private_key_path", "No such file")),
    Mistake(
        "vonage key not a key", ("config", "check", "--set", "vonage.private_key_path={tmp}/garbage.key"), 2,
        ("vonage.private_key_path", "not a PEM private key"), files={"garbage.key": b"not a key\n"},
    ),  # fmt: skip
    Mistake("no workers", ("serve", "--workers", "0"), 2, ("server.workers", "greater than or equal to 1")),
    Mistake(
        "SIP TLS certificate missing",
        ("serve", "--port", "{free}", "--set", "sip.enabled=true", "--set", "sip.port={free2}", "--set", "sip.tls_certificate={tmp}/none.crt",
         "--set", "sip.tls_private_key={tmp}/none.key"), 2, ("sip.tls_certificate", "none.crt", "cannot be read"),
    ),  # fmt: skip
    Mistake("SIP TLS key without its certificate", ("config", "check", "--set", "sip.tls_private_key=/k.pem"), 2, ("tls_certificate and tls_private_key go together",)),
    # Found in session 14: each passed config check, then a traceback at serve (Exotel's CIDR) or broken calls.
    Mistake("exotel source not a CIDR", ("serve", "--set", "exotel.allowed_sources=[1.2.3.4/99]"), 2, ("exotel.allowed_sources.0", "CIDR", "'1.2.3.4/99'")),
    Mistake("SIP trusted address not an IP", ("config", "check", "--set", "sip.allowed_ips=[10.0.0.0/8,trunk]"), 2, ("sip.allowed_ips.1", "CIDR", "'trunk'")),
    Mistake("SIP public address not a host", ("config", "check", "--set", "sip.public_address=my_sbc"), 2, ("sip.public_address", "host name", "'my_sbc'")),
    Mistake(
        "transfer target neither number nor URI", ("config", "check", "--set", "call_actions.transfer_targets=[front desk]"), 2,
        ("call_actions.transfer_targets.0", "SIP URI", "'front desk'"),
    ),  # fmt: skip
    # Extras the settings need.
    Mistake(
        "redis registry without the redis extra", ("serve", "--set", "registry.backend=redis", "--set", "registry.redis_url=redis://127.0.0.1:1"),
        2, ("registry.backend", "pip install 'callbridge[redis]'"), without_extras=True,
    ),  # fmt: skip
    Mistake("inline engine without vllm-omni", ("serve", "--set", "engine.kind=inline"), 2, ("engine.kind", "pip install 'callbridge[omni]'"), without_extras=True),
    # Listeners whose address cannot be had.
    Mistake("HTTP port in use", ("serve", "--port", "{held_tcp}"), 3, ("server.port", "address already in use", "another port")),
    Mistake("engine server port in use", ("engine-server", "--port", "{held_tcp}"), 3, ("engine_server.port", "address already in use")),
    Mistake(
        "SIP port in use", ("serve", "--port", "{free}", "--set", "sip.enabled=true", "--set", "sip.port={held_udp}"), 3,
        ("sip.port", "/udp", "address already in use"),
    ),  # fmt: skip
    Mistake(
        "SIP TLS port in use",
        ("serve", "--port", "{free}", "--set", "sip.enabled=true", "--set", "sip.port={free2}", "--set", "sip.tls_certificate={tmp}/sip.crt",
         "--set", "sip.tls_private_key={tmp}/sip.key", "--set", "sip.tls_port={held_tcp}"), 3,
        ("sip.tls_port", "address already in use"), files=_TLS_PAIR,
    ),  # fmt: skip
    Mistake(
        "AudioSocket port in use", ("serve", "--port", "{free}", "--set", "audiosocket.enabled=true", "--set", "audiosocket.port={held_tcp}"),
        3, ("audiosocket.port", "address already in use"),
    ),  # fmt: skip
    Mistake("host not this machine's", ("serve", "--host", "192.0.2.1"), 3, ("server.port", "192.0.2.1", "no interface")),
    # Usage.
    Mistake("unknown command", ("serve-all",), 2, ("serve-all", "--help")),
    Mistake("dtmf without a time", ("simulate", "--dtmf", "5"), 2, ("--dtmf", "S:DIGIT")),
    Mistake("dtmf not a digit", ("simulate", "--dtmf", "2:Z"), 2, ("--dtmf",)),
    Mistake("dtmf before the call", ("simulate", "--dtmf", "-1:5"), 2, ("--dtmf",)),
    Mistake("negative hang-up time", ("simulate", "--hangup-at", "-1"), 2, ("--hangup-at", "0 or more")),
    Mistake("echo louder than the agent", ("simulate", "--echo-db", "-6"), 2, ("--echo-db", "from 0 to 60")),
    Mistake("echo delay not a number", ("simulate", "--echo-delay-ms", "soon"), 2, ("--echo-delay-ms", "milliseconds")),
    Mistake("line noise out of range", ("simulate", "--noise", "120"), 2, ("--noise", "from 0 to 80")),
    Mistake("zero-length load test calls", ("loadtest", "--duration", "0"), 2, ("--duration", "more than 0")),
    Mistake("no calls", ("loadtest", "--calls", "0"), 2, ("--calls", "1 or more")),
    Mistake("calls not a number", ("loadtest", "--calls", "many"), 2, ("--calls",)),
    Mistake("load test url not a url", ("loadtest", "--url", "bridge:8080", "--secret", "s"), 2, ("--url", "http://host:port")),
    Mistake("load test url where nothing listens", ("loadtest", "--url", "http://127.0.0.1:{free}", "--secret", "s"), 1, ("--url", "nothing answers")),
    # Files: checked before the run, not after it.
    Mistake("caller audio missing", ("simulate", "--audio", "{tmp}/nope.wav"), 2, ("--audio", "nope.wav")),
    Mistake("caller audio empty", ("simulate", "--audio", "{tmp}/empty.wav"), 2, ("--audio", "empty or cut short", "16-bit PCM WAV"), files={"empty.wav": b""}),
    Mistake("caller audio not a WAV", ("simulate", "--audio", "{tmp}/notes.wav"), 2, ("--audio", "RIFF"), files={"notes.wav": b"not a wav file at all"}),
    Mistake("caller audio μ-law", ("simulate", "--audio", "{tmp}/mulaw.wav"), 2, ("--audio", "unknown format: 7"), files={"mulaw.wav": _MULAW_WAV}),
    Mistake("caller audio without samples", ("simulate", "--audio", "{tmp}/none.wav"), 2, ("--audio", "holds no audio"), files={"none.wav": _header_only_wav()}),
    Mistake("load test audio not a WAV", ("loadtest", "--audio", "{tmp}/notes.wav"), 2, ("--audio", "RIFF"), files={"notes.wav": b"not a wav"}),
    Mistake("heard audio's folder missing", ("simulate", "--out", "{tmp}/no/such/heard.wav"), 2, ("--out", "does not exist")),
    Mistake("PNG's folder missing", ("loadtest", "--png", "{tmp}/no/such/plot.png"), 2, ("--png", "does not exist")),
    Mistake("JSON report to a folder", ("loadtest", "--json", "{tmp}"), 2, ("--json", "is a directory")),
]


@pytest.fixture
def held_ports() -> Iterator[tuple[int, int]]:
    """A TCP port with a listener on it and a UDP port bound, both on 127.0.0.1, held for the test. The UDP port's
    TCP twin is free when it is chosen (the kernel picks a UDP port regardless of TCP's: a twin another test's socket
    holds would make SIP's check fail twice, /udp and /tcp)."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    while True:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as twin:
                twin.bind(("127.0.0.1", udp.getsockname()[1]))
            break
        except OSError:
            udp.close()
    try:
        yield tcp.getsockname()[1], udp.getsockname()[1]
    finally:
        tcp.close()
        udp.close()


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.name for m in MISTAKES])
def test_each_mistake_is_one_line_naming_what_to_fix(mistake: Mistake, tmp_path: Path, held_ports: tuple[int, int]) -> None:
    for name, content in mistake.files.items():
        (tmp_path / name).write_bytes(content)
    held_tcp, held_udp = held_ports
    places = {"{tmp}": str(tmp_path), "{held_tcp}": str(held_tcp), "{held_udp}": str(held_udp), "{free}": str(free_port()), "{free2}": str(free_port())}
    args = []
    for arg in mistake.args:
        for place, value in places.items():
            arg = arg.replace(place, value)
        args.append(arg)
    command = [sys.executable, "-c", _BLOCK_EXTRAS] if mistake.without_extras else [sys.executable, "-m", "callbridge"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CALLBRIDGE_")}
    result = subprocess.run(
        [*command, *args], capture_output=True, text=True, env={**clean, **mistake.env}, cwd=tmp_path, timeout=60
    )
    assert result.returncode == mistake.code, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("callbridge"), result.stderr
    for words in mistake.says:
        assert words.replace("{tmp}", str(tmp_path)) in lines[0], lines[0]
    assert result.stdout == ""
    assert not any(tmp_path.glob("*.png")) and not (tmp_path / "heard.wav").exists()  # nothing ran


@pytest.mark.parametrize(
    ("assignment", "env", "shown"),
    [
        (("--set", 'engine.urls=["ws://gpu-1:8091"]'), {}, ("engine", "urls", ["ws://gpu-1:8091"])),
        (("--set", "engine.urls=['ws://a:1', \"wss://b\"]"), {}, ("engine", "urls", ["ws://a:1", "wss://b"])),
        (("--set", "engine.urls=[ws://a:1, ws://b:2]"), {}, ("engine", "urls", ["ws://a:1", "ws://b:2"])),
        ((), {"CALLBRIDGE_ENGINE__URLS": '["ws://gpu-1:8091"]'}, ("engine", "urls", ["ws://gpu-1:8091"])),
        ((), {"CALLBRIDGE_ENGINE__URLS": "['ws://gpu-1:8091']"}, ("engine", "urls", ["ws://gpu-1:8091"])),
        ((), {"CALLBRIDGE_VONAGE__AUDIO_RATE_HZ": "8000"}, ("vonage", "audio_rate_hz", 8000)),
        (("--set", "audio.engine_input_rate_hz=24000"), {}, ("audio", "engine_input_rate_hz", 24000)),
        ((), {"CALLBRIDGE_AUDIO__ENGINE_INPUT_RATE_HZ": "8000"}, ("audio", "engine_input_rate_hz", 8000)),
        (("--set", "engine.heartbeat_interval_s=10"), {}, ("engine", "heartbeat_interval_s", 10.0)),
    ],
)
def test_env_and_set_take_lists_and_integer_choices_as_toml_does(
    assignment: tuple[str, ...], env: dict[str, str], shown: tuple[str, str, object]
) -> None:
    """Before: ``--set 'engine.urls=["ws://…"]'`` kept the quotes inside the URL, a TOML-form env list was refused,
    and ``CALLBRIDGE_VONAGE__AUDIO_RATE_HZ=8000`` (docs/carriers.md's own example) made ``serve`` refuse to start."""
    import tomllib

    clean = {k: v for k, v in os.environ.items() if not k.startswith("CALLBRIDGE_")}
    result = subprocess.run(
        [sys.executable, "-m", "callbridge", "config", "check", *assignment],
        capture_output=True, text=True, env={**clean, **env}, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    section, key, value = shown
    assert tomllib.loads(result.stdout)[section][key] == value
