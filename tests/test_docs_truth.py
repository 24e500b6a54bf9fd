"""What the README, docs/, the example configuration, bench/RESULTS.md and the deployment files name exists: every
``CALLBRIDGE_SECTION__KEY`` is a setting, every ``section.key`` in backquotes is a setting, every repository path
in backquotes and every relative link is a file, and every ``callbridge_…`` metric is one the code defines.
An operator who copies a name from the docs gets a thing that is there."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from callbridge.carriers.sip.settings import SipRegistrationSettings
from callbridge.config import Settings

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted(
    [
        ROOT / "README.md",
        ROOT / "bench" / "RESULTS.md",
        ROOT / "config" / "callbridge.example.toml",
        ROOT / "Dockerfile",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "deploy").rglob("*.yaml"),
        *(ROOT / "deploy").rglob("*.cfg"),
    ]
)
_REPO_DIRS = ("callbridge", "tests", "bench", "deploy", "docs", "config")
_SUFFIXES = re.compile(r"_(total|bucket|sum|count|created)$")
_LEAK_GAUGES = re.compile(r"callbridge_\w+_above_idle")
"""bench/soak.py's report lines name gauges less their idle level: figures of the soak, not metrics."""


def _settings_keys() -> set[str]:
    keys: set[str] = set()

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            keys.add(prefix + name)
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                walk(field.annotation, f"{prefix}{name}.")

    walk(Settings, "")
    walk(SipRegistrationSettings, "sip.registrations.")
    return keys


KEYS = _settings_keys()
SECTIONS = {key.split(".")[0] for key in KEYS}
CODE = "\n".join(path.read_text() for path in (ROOT / "callbridge").rglob("*.py"))


def _defined(metric: str) -> bool:
    """``metric`` (or a family ``callbridge_engine_endpoint_*``, written up to its ``_``) is a name the code gives."""
    if metric.endswith("_"):
        return f'"{metric}' in CODE
    return f'"{_SUFFIXES.sub("", metric)}"' in CODE or f'"{metric}"' in CODE


def _named(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


@pytest.mark.parametrize("doc", DOCS, ids=_named)
def test_every_env_var_named_is_a_setting(doc: Path) -> None:
    found = re.findall(r"CALLBRIDGE_([A-Z0-9_]+?)__([A-Z0-9_]+)", doc.read_text())
    unknown = sorted({f"{section.lower()}.{key.lower()}" for section, key in found} - KEYS)
    assert unknown == [], f"{_named(doc)} names settings that do not exist: {unknown}"


@pytest.mark.parametrize("doc", DOCS, ids=_named)
def test_every_setting_in_backquotes_exists(doc: Path) -> None:
    named = re.findall(r"`([a-z_]+\.[a-z_0-9]+(?:\.[a-z_0-9]+)?)(?:\s*=[^`]*)?`", doc.read_text())
    unknown = sorted({key for key in named if key.split(".")[0] in SECTIONS and key not in KEYS and not key.endswith((".py", ".yaml", ".org", ".com"))})
    assert unknown == [], f"{_named(doc)} names settings that do not exist: {unknown}"


@pytest.mark.parametrize("doc", DOCS, ids=_named)
def test_every_path_and_link_is_a_file(doc: Path) -> None:
    text = doc.read_text()
    paths = re.findall(rf"`((?:{'|'.join(_REPO_DIRS)})/[^`\s:]*)", text)
    paths = [path.replace("<name>", "twilio") for path in paths]  # a carrier's package, shown as a pattern
    missing = sorted(
        {path for path in paths if not (ROOT / path.rstrip(".,)")).exists() and not (ROOT / (path.replace(".", "/") + ".py")).exists()}
    )
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    missing += sorted({link for link in links if not (doc.parent / link).exists()})
    assert missing == [], f"{_named(doc)} points at files that are not in the repository: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_named)
def test_every_metric_named_is_defined(doc: Path) -> None:
    text = _LEAK_GAUGES.sub("", doc.read_text())
    names = set(re.findall(r"\b(callbridge_[a-z0-9_]+)", text))
    unknown = sorted(name for name in names if not _defined(name))
    assert unknown == [], f"{_named(doc)} names metrics the code does not define: {unknown}"


def _command_options() -> dict[str, set[str]]:
    """Each command (``serve``, ``config check``…) and the options it takes."""
    from callbridge.cli import _build_parser

    found: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        found[name] = set(parser._option_string_actions)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}".strip())

    walk(_build_parser(), "")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=_named)
def test_every_command_line_shown_takes_its_options(doc: Path) -> None:
    """``callbridge loadtest --calls 100 …``, in a code block or in backquotes: each option is that command's."""
    commands = _command_options()
    wrong: list[str] = []
    text = doc.read_text().replace("\\\n", " ")
    for line in re.findall(r"(?:^|`|\s)(?:\.venv/bin/)?callbridge ((?:[a-z][a-z-]* )*(?:--[a-z-]+[^\n`]*)?)", text, re.MULTILINE):
        words = line.split()
        command = ""
        while words and not words[0].startswith("-") and f"{command} {words[0]}".strip() in commands:
            command = f"{command} {words.pop(0)}".strip()
        if not command:
            continue
        wrong += [f"callbridge {command} {word}" for word in words if re.fullmatch(r"--[a-z-]+", word) and word not in commands[command]]
    assert wrong == [], f"{_named(doc)} shows options its commands do not take: {sorted(set(wrong))}"


def _block_after(text: str, marker: str, language: str) -> str:
    start = text.index(marker)
    opening = text.index(f"```{language}\n", start) + len(f"```{language}\n")
    return text[opening : text.index("```", opening)]


def test_the_adding_a_carrier_example_is_the_code() -> None:
    """docs/carriers.md's jambonz example: each added line of its registry diff is in the registry, and its SPEC is the
    package's (comments aside)."""
    page = (ROOT / "docs" / "carriers.md").read_text()
    registry = (ROOT / "callbridge/carriers/__init__.py").read_text()
    added = [line[1:] for line in _block_after(page, "### Adding a carrier", "diff").splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added and all(line in registry.splitlines() for line in added), added
    shown = _block_after(page, "Its `SPEC` is the record", "python")
    package = (ROOT / "callbridge/carriers/jambonz/__init__.py").read_text()
    code = package[package.index("SPEC = CarrierSpec(") :]
    code = code[: code.index("\n)\n") + 3]

    def bare(text: str) -> list[str]:
        return [line.split("  #")[0].rstrip() for line in text.strip().splitlines()]

    assert bare(shown) == bare(code)
