"""Configuration: sources and their precedence, validation messages, the documented example."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from callbridge.codecs import ResamplerQuality
from callbridge.config import (
    ConfigError,
    LogFormat,
    Settings,
    load_settings,
    merge_overrides,
    parse_assignment,
)

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config" / "callbridge.example.toml"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("CALLBRIDGE_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "callbridge.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    settings = load_settings()
    assert settings.server.port == 8080
    assert settings.engine.kind == "local"
    assert settings.audio.resampler_quality is ResamplerQuality.LD
    assert settings.log.format is LogFormat.AUTO


def test_precedence_file_env_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, '[server]\nport = 9001\nhost = "10.1.1.1"\nmax_calls = 7\n[local_engine]\nagent = "tone"\n')
    monkeypatch.setenv("CALLBRIDGE_SERVER__PORT", "9002")
    monkeypatch.setenv("CALLBRIDGE_SERVER__HOST", "10.2.2.2")
    settings = load_settings(path, {"server": {"host": "0.0.0.0"}})
    assert settings.server.host == "0.0.0.0"  # CLI over env
    assert settings.server.port == 9002  # env over file
    assert settings.server.max_calls == 7  # file over default
    assert settings.local_engine.agent == "tone"
    assert settings.audio.playout_lead_ms == 200  # default


def test_config_file_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLBRIDGE_CONFIG", str(write(tmp_path, "[server]\nport = 9100\n")))
    assert load_settings().server.port == 9100


def test_list_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLBRIDGE_ENGINE__URLS", '["ws://gpu-1:8091", "ws://gpu-2:8091"]')
    assert load_settings().engine.urls == ["ws://gpu-1:8091", "ws://gpu-2:8091"]


def problems(exc: pytest.ExceptionInfo[ConfigError]) -> dict[str, str]:
    return {p.key: p.problem for p in exc.value.problems}


def test_invalid_value_names_the_key_and_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLBRIDGE_SERVER__PORT", "70000")
    with pytest.raises(ConfigError) as exc:
        load_settings()
    assert "less than or equal to 65535" in problems(exc)["server.port"]
    assert "70000" in problems(exc)["server.port"]


def test_unknown_keys_are_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLBRIDGE_SERVER__PROT", "1")
    with pytest.raises(ConfigError) as exc:
        load_settings(write(tmp_path, "[servre]\nport = 1\n[log]\nlevle = 'debug'\n"))
    assert problems(exc) == {"servre": "unknown key", "log.levle": "unknown key", "server.prot": "unknown key"}


def test_every_problem_reported_at_once() -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(None, {"log": {"level": "verbose"}, "audio": {"playout_lead_ms": "5"}})
    assert set(problems(exc)) == {"log.level", "audio.playout_lead_ms"}


def test_secret_values_never_echoed() -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(None, {"twilio": {"auth_token": 12345}})
    assert "12345" not in str(exc.value)


def test_bad_toml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nport = = 1\n")
    with pytest.raises(ConfigError) as exc:
        load_settings(path)
    assert re.search(r"invalid TOML: .*line 2", problems(exc)[str(path)])


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(tmp_path / "nope.toml")
    assert problems(exc) == {str(tmp_path / "nope.toml"): "config file not found"}


def test_public_dict_masks_secrets() -> None:
    settings = load_settings(None, {"twilio": {"auth_token": "s3cret"}, "registry": {"redis_url": "redis://:pw@h"}})
    shown = settings.public_dict()
    assert shown["twilio"]["auth_token"] == "********"
    assert shown["registry"]["redis_url"] == "********"
    assert shown["plivo"]["auth_token"] is None
    assert "s3cret" not in repr(shown) and "pw@" not in repr(shown)
    assert settings.twilio.auth_token is not None and settings.twilio.auth_token.get_secret_value() == "s3cret"


def test_parse_assignment() -> None:
    assert parse_assignment("server.port=9000") == {"server": {"port": "9000"}}
    assert parse_assignment("engine.urls=[ws://a, ws://b]") == {"engine": {"urls": ["ws://a", "ws://b"]}}
    assert parse_assignment("engine.instructions=a=b") == {"engine": {"instructions": "a=b"}}
    for bad in ("server.port", "=1", "server..port=1"):
        with pytest.raises(ConfigError):
            parse_assignment(bad)


def test_merge_overrides_is_deep() -> None:
    merged = merge_overrides({"server": {"port": "1"}}, {"server": {"host": "h"}}, {"server": {"port": "2"}})
    assert merged == {"server": {"port": "2", "host": "h"}}


class TestExampleFile:
    """config/callbridge.example.toml documents every key with its default."""

    def test_loads(self) -> None:
        load_settings(EXAMPLE)

    def test_every_key_documented_once_with_its_default(self) -> None:
        text = EXAMPLE.read_text()
        active = tomllib.loads(text)
        defaults = Settings().public_dict()
        for name, values in list(defaults.items()):  # a nested section (``[sip.outbound]``) is checked as its own
            for key, value in list(values.items()):
                if isinstance(value, dict) and f"[{name}.{key}]" in text:
                    defaults[f"{name}.{key}"] = value
                    active[f"{name}.{key}"] = active.get(name, {}).pop(key, {})
                    del values[key]
        section = None
        documented: dict[str, list[str]] = {}
        for line in text.splitlines():
            if m := re.fullmatch(r"\[(\w+(?:\.\w+)?)\]", line):
                section = m.group(1)
                documented.setdefault(section, [])
            elif section and (m := re.match(r"^#? ?(\w+) = ", line)):
                documented[section].append(m.group(1))
        assert set(documented) == set(defaults)
        for name, values in defaults.items():
            assert sorted(documented[name]) == sorted(values), name
            for key, default in values.items():
                if key in active.get(name, {}):
                    assert active[name][key] == default, f"{name}.{key}"
                else:
                    assert default is None, f"{name}.{key} has a default but is commented out"
