"""Counting the event types no codec knows (``BridgeServices.unknown_carrier_event``): the names come off the wire,
unauthenticated, so the metric's series and the log stay bounded whatever a peer sends."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from callbridge.bridge.metrics import BridgeMetrics
from callbridge.bridge.registry import MemoryCallRegistry, MemoryStreamTokens
from callbridge.bridge.services import UNKNOWN_EVENT_NAMES, BridgeServices
from callbridge.config import load_settings
from callbridge.engine.local.core import LocalEngineOptions
from callbridge.engine.local.engine import LocalEngine

pytestmark = pytest.mark.core


class Log:
    def __init__(self) -> None:
        self.warnings: list[dict[str, Any]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append({"event": event, **fields})


def services() -> tuple[BridgeServices, CollectorRegistry]:
    registry = CollectorRegistry()
    built = BridgeServices(
        settings=load_settings(None, {}), engine=LocalEngine(LocalEngineOptions()), registry=MemoryCallRegistry(),
        tokens=MemoryStreamTokens(), metrics=BridgeMetrics(registry, memory_registry=True, local_engine=True),
        hang_up=lambda *args: None,  # type: ignore[arg-type, return-value]
    )  # fmt: skip
    return built, registry


def count(registry: CollectorRegistry, provider: str, event: str) -> float | None:
    return registry.get_sample_value("callbridge_unknown_events_total", {"provider": provider, "event": event})


def test_each_type_is_counted_by_name_and_logged_once() -> None:
    found, registry = services()
    log = Log()
    for _ in range(3):
        found.unknown_carrier_event("twilio", "transcription", log)  # type: ignore[arg-type]
    found.unknown_carrier_event("telnyx", "transcription", log)  # type: ignore[arg-type]
    assert count(registry, "twilio", "transcription") == 3 and count(registry, "telnyx", "transcription") == 1
    assert [(w["event"], w["event_type"]) for w in log.warnings] == [("unknown_carrier_event", "transcription")] * 2


def test_names_past_the_limit_or_not_name_like_count_as_other() -> None:
    found, registry = services()
    log = Log()
    for i in range(UNKNOWN_EVENT_NAMES + 50):
        found.unknown_carrier_event("twilio", f"kind{i}", log)  # type: ignore[arg-type]
    found.unknown_carrier_event("vonage", "<script>", log)  # type: ignore[arg-type]
    named = {s.labels["event"] for m in registry.collect() if m.name == "callbridge_unknown_events" for s in m.samples}
    assert len(named) == UNKNOWN_EVENT_NAMES + 1  # the first 64 by name, the rest as "other"
    assert count(registry, "twilio", "other") == 50 and count(registry, "vonage", "other") == 1
    assert len(log.warnings) == UNKNOWN_EVENT_NAMES + 2  # once per name counted, once per carrier's "other"
