"""The simulated trunk as a wideband, encrypting phone (#43): where the bridge's ``sip.codecs`` names G.722 or Opus
first and ``sip.media_encryption`` is ``required``, it offers that codec alone in ``RTP/SAVP`` with a key of its own,
codes its audio through 16 kHz and protects every packet; it reads the bridge's answer and every packet back as
strictly as it does G.711 (so ``callbridge simulate`` and ``loadtest --provider sip`` run Opus and SRTP calls). End
to end over real UDP on loopback; the call's report names the codec, the encryption and a clean line."""

from __future__ import annotations

import pytest

from callbridge.carriers.sip.listener import SipListener
from callbridge.carriers.sip.sim import SimulatedSip
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from callbridge.sip.srtp import SrtpSession
from tests.bridge.twilio_e2e import engine, settings, short_speech, until
from tests.conftest import NEEDS_LIBOPUS


@pytest.mark.parametrize("codec", ["G722", pytest.param("opus", marks=NEEDS_LIBOPUS)])
async def test_a_wideband_srtp_call_from_the_simulated_trunk_is_heard_both_ways_with_no_warning(
    codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """… and what went over the wire, both ways, is not the audio: every RTP packet's payload as it arrived differs
    from what SRTP gave back in nearly all of its bytes, and carries the 80-bit tag after it."""
    on_the_wire: list[tuple[bytes, bytes]] = []
    unprotect = SrtpSession.unprotect

    def tapped(session: SrtpSession, packet: bytes) -> bytes | None:
        plain = unprotect(session, packet)
        if plain is not None:
            on_the_wire.append((packet, plain))
        return plain

    monkeypatch.setattr(SrtpSession, "unprotect", tapped)
    configured = settings(sip={"codecs": [codec, "PCMU"], "media_encryption": "required"})
    async with running_bridge(configured, engine(), provider="sip") as bridge:
        trunk = bridge.carrier
        assert isinstance(trunk, SimulatedSip) and trunk.offer == ({"G722": 9, "opus": 111}[codec],) and trunk.srtp_key
        result = await trunk.place_call(CallerScript(utterances=((300, short_speech(1200)),), hangup_at_ms=4500))
        sip = bridge.app.state.bridge.services.carrier_state["sip"]
        assert isinstance(sip, SipListener)
        await until(lambda: len(sip.finished) == 1)
        _, rtp_codec, transport = sip.finished[0]
    assert not result.warnings, result.warnings
    assert result.hung_up_by == "caller" and result.agent_speech_ms >= 800, result.render()  # the echo of 1.2 s
    media = transport.media_quality()
    assert media is not None and (media.codec, media.encryption, media.packets_lost) == (codec, "srtp", 0), media
    assert transport.srtp is not None and rtp_codec.malformed == 0 and not sip.dropped, sip.dropped
    assert len(on_the_wire) >= 300, len(on_the_wire)  # 4.5 s of 20 ms packets each way
    for packet, plain in on_the_wire:
        assert len(packet) == len(plain) + 10 and packet[:12] == plain[:12]  # the header in clear, the tag after
        payload, clear = packet[12 : len(plain)], plain[12:]
        assert sum(a == b for a, b in zip(payload, clear, strict=True)) <= 2 + len(clear) // 20  # chance: 1 in 256
