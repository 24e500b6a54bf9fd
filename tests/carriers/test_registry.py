"""The carrier registry (``callbridge.carriers.CARRIERS``) is the one list, and what each ``CarrierSpec`` says is
what the carrier's own modules do: its routes load under its name, its capabilities are its codec's profile and
its simulator's behaviour, its settings section and secret exist."""

from __future__ import annotations

import asyncio
import importlib

import orjson
import pytest

from callbridge.bridge.carrier_plugin import load_carrier
from callbridge.carriers import CARRIERS, carrier_spec, direct_names, simulated_names
from callbridge.carriers.base import CarrierProfile
from callbridge.carriers.generic.wire import default_candidates, recognise
from callbridge.carriers.spec import CarrierSpec
from callbridge.config import Settings
from callbridge.sim.simulators import simulated, simulator_class

pytestmark = pytest.mark.core

SPECS = {spec.name: spec for spec in CARRIERS}


def _profile(spec: CarrierSpec) -> CarrierProfile:
    if spec.codec is not None:
        return spec.codec_factory()().profile
    profile = importlib.import_module(f"{spec.package}.wire").PROFILE
    assert isinstance(profile, CarrierProfile)
    return profile


def test_names_are_unique_and_each_package_is_its_own() -> None:
    assert len(SPECS) == len(CARRIERS)
    for spec in CARRIERS:
        assert importlib.import_module(spec.package).SPEC is spec  # the package of that name declares it
        assert carrier_spec(spec.name) is spec
    with pytest.raises(LookupError):
        carrier_spec("nope")


@pytest.mark.parametrize("spec", CARRIERS, ids=lambda spec: spec.name)
def test_the_carrier_loads_under_its_name(spec: CarrierSpec) -> None:
    carrier = load_carrier(spec)
    assert carrier.name == spec.name
    assert carrier.router is not None or carrier.listener is not None  # something of it is served


@pytest.mark.parametrize("spec", [s for s in CARRIERS if s.name != "generic"], ids=lambda spec: spec.name)
def test_capabilities_are_what_the_codec_and_the_simulator_do(spec: CarrierSpec) -> None:
    profile = _profile(spec)
    assert (profile.uses_marks, profile.flushes) == (spec.capabilities.marks, spec.capabilities.flush)
    if spec.name == BROWSER:
        return
    simulator = simulator_class(spec)
    assert simulator.provider == spec.name
    assert simulator.can_reconnect == spec.capabilities.reconnect
    assert simulator.uses_marks == spec.capabilities.marks
    carrier = load_carrier(spec)
    if spec.capabilities.dtmf_out or spec.capabilities.transfer:  # a REST client that acts, or a listener that does
        rest = carrier.rest(Settings()) if carrier.rest is not None else None
        assert hasattr(rest, "perform") or spec.name in ("telnyx", "sip"), spec.name  # those two register at start
        if rest is not None:
            asyncio.run(rest.aclose())


@pytest.mark.parametrize("spec", [s for s in CARRIERS if s.section is not None], ids=lambda spec: spec.name)
def test_the_settings_section_and_the_secret_exist(spec: CarrierSpec) -> None:
    assert spec.section is not None
    section = Settings.model_fields[spec.section].annotation
    assert section is not None and hasattr(section, "model_fields")
    if spec.secret is not None:
        assert spec.secret in section.model_fields  # type: ignore[attr-defined]


def test_the_generic_media_url_takes_every_websocket_carrier() -> None:
    websocket = {spec.name for spec in CARRIERS if spec.transport == "websocket" and spec.name != "generic"}
    candidates = default_candidates()
    assert {c.name for c in candidates} == websocket == {"twilio", "signalwire", "telnyx", "plivo", "exotel", "vonage", "bandwidth", "jambonz"}
    for candidate in candidates:
        assert candidate.codec().provider == candidate.name


def test_each_carrier_recognises_only_its_own_first_message() -> None:
    """The generic URL asks the carriers in the registry's order; each first message is recognised by its own
    carrier alone, so the order decides nothing (tests/carriers/test_detect.py holds the messages)."""
    from tests.carriers.test_detect import FIRST_MESSAGES

    candidates = default_candidates()
    for name, messages in FIRST_MESSAGES.items():
        first = orjson.loads(messages[-1])
        assert [c.name for c in candidates if c.recognises(first)] == [name]
        assert (found := recognise(first, candidates)) is not None and found.name == name
    assert recognise({"event": "start", "start": {}}, candidates) is None


BROWSER = "webrtc"
"""The browser phone: its far end is a browser (``carriers/webrtc/sim.py``'s aiortc peer, and Chromium on the page in
``tests/carriers/test_talk_page_browser.py``), not a carrier's simulator."""


def test_every_carrier_but_the_generic_url_and_the_browser_phone_is_simulated() -> None:
    assert set(simulated_names()) == set(SPECS) - {"generic", BROWSER} == set(simulated())


@pytest.mark.parametrize("spec", [spec for spec in CARRIERS if spec.simulator is not None], ids=lambda spec: spec.name)
def test_a_direct_mode_is_where_the_spec_says(spec: CarrierSpec) -> None:
    """``loadtest --ws-url`` offers what the specs say; each such simulator calls the URL it is given."""
    simulator = simulator_class(spec)
    if spec.direct_protocol is None:
        with pytest.raises(LookupError):
            simulator.direct("ws://127.0.0.1:9/media")
    else:
        direct = simulator.direct("ws://127.0.0.1:9/media")
        assert direct.provider == spec.name and direct.rest_routes() == []
        asyncio.run(direct.aclose())
    assert (spec.name in direct_names()) == (spec.direct_protocol is not None)
