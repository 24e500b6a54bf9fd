"""A call from a real SIP phone: baresip (Debian ``baresip-core``) dials the bridge with a WAV file as its
microphone (``aufile``) and records what it hears (``sndfile``); the echo agent's reply must be in the recording.
baresip also advertises an address in its SDP that is not where its RTP comes from: symmetric RTP must cope."""

from __future__ import annotations

import asyncio
import base64
import shutil
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from callbridge.carriers.sip.rtp_transport import RtpTransport
from callbridge.carriers.sip.wire import SipRtpCodec
from callbridge.codecs import AudioEncoding, ResamplerQuality, StreamResampler
from callbridge.engine.commands import AppendAudio
from callbridge.sim.ports import RTP_PORTS, free_port
from callbridge.sim.runner import RunningBridge, load_wav_8k, running_bridge, sample_caller_wav
from tests.bridge.test_outbound_e2e import TOKEN, post_call
from tests.bridge.twilio_e2e import engine, settings, until
from tests.conftest import NEEDS_LIBOPUS
from tests.sip.test_sipp_e2e import listener

pytestmark = pytest.mark.skipif(shutil.which("baresip") is None, reason="baresip (Debian package baresip-core) is not installed")

SPEECH_S = 3.69
"""The bundled caller utterance; followed by silence so the phone stays on the line for the reply."""


def configure(
    directory: Path, caller_wav: Path, *, account: str = "<sip:caller@127.0.0.1>;regint=0", port: int | None = None,
    extra: tuple[str, ...] = (), codecs: tuple[str, ...] = ("g711",),
) -> Path:
    config = directory / "cfg"
    config.mkdir()
    (directory / "snd").mkdir()
    lines = [
        "poll_method epoll",
        f"sip_listen 127.0.0.1:{port or free_port()}",
        "audio_player alsa,null",  # ALSA's null device: nothing to play to, the sndfile filter records
        "audio_alert alsa,null",
        f"audio_source aufile,{caller_wav}",
        "module_path /usr/lib/baresip/modules",
        *extra,  # before the modules: an account's mediaenc needs its module loaded first
        *(f"module {name}.so" for name in (*codecs, "aufile", "alsa", "sndfile", "menu", "account")),
        f"snd_path {directory / 'snd'}",
    ]
    (config / "config").write_text("\n".join(lines) + "\n")
    (config / "accounts").write_text(account + "\n")
    return config


def microphone(path: Path) -> Path:
    """The phone's microphone: the bundled utterance, then 7 s of silence (it stays on the line for the reply)."""
    return _wav(path, 8000, load_wav_8k(sample_caller_wav()) + bytes(16000 * 7))


def _wav(path: Path, rate_hz: int, pcm: bytes, channels: int = 1) -> Path:
    if channels == 2:
        pcm = np.repeat(np.frombuffer(pcm, dtype="<i2"), 2).tobytes()
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate_hz)
        out.writeframes(pcm)
    return path


def loud_ms(path: Path) -> int:
    """How much of a recording is not silence (20 ms frames above an RMS of 300)."""
    with wave.open(str(path)) as recording:
        samples = np.frombuffer(recording.readframes(recording.getnframes()), dtype="<i2")[:: recording.getnchannels()].astype(np.float64)
        frame = recording.getframerate() // 50
    frames = samples[: len(samples) // frame * frame].reshape(-1, frame)
    return int((np.sqrt((frames**2).mean(axis=1)) > 300).sum()) * 20


async def dial_from_baresip(config: Path, uri: str) -> bytes:
    """baresip with ``config`` dials ``uri``, and hangs up at the end of its WAV file; what it printed."""
    phone = await asyncio.create_subprocess_exec(
        "baresip", "-f", str(config), "-e", f"/dial {uri}", "-t", "15",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(phone.communicate(), 40)
    except TimeoutError:
        phone.kill()
        await phone.wait()
        raise
    return output


async def call_baresip(bridge: RunningBridge, config: Path) -> bytes:
    """The agent calls baresip (``config`` answering by itself) through the SIP trunk, until the phone hangs up at the
    end of its WAV file; what the phone printed."""
    phone = await asyncio.create_subprocess_exec(
        "baresip", "-f", str(config), "-t", "20", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        await asyncio.sleep(1.0)  # its SIP sockets up
        response = await post_call(bridge, {"carrier": "sip", "to": "+15005550123", "from": "+15005550006"})
        assert response.status_code == 202, response.text
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1, timeout_s=30)
    finally:
        phone.terminate()
        output, _ = await phone.communicate()
    return output


@pytest.mark.long
async def test_baresip_hears_the_echo_agent(tmp_path: Path) -> None:
    caller_wav = microphone(tmp_path / "caller.wav")
    config = configure(tmp_path, caller_wav)
    recorder = engine()
    sip_settings = settings(sip={"enabled": True, "port": free_port(), **RTP_PORTS})
    async with running_bridge(sip_settings, recorder, provider="twilio") as bridge:
        uri = f"sip:agent@127.0.0.1:{bridge.settings.sip.port}"
        output = await dial_from_baresip(config, uri)
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
        _, codec, transport = sip.finished[0]
    log = output.decode(errors="replace")
    assert "Call established" in log, log[-2000:]
    (session_id,) = recorder.opened
    appended = [c for c in recorder.commands[session_id] if isinstance(c, AppendAudio)]
    heard_s = sum(len(c.pcm) for c in appended) / (2 * appended[0].rate_hz)
    assert heard_s > SPEECH_S, heard_s  # the caller's whole utterance reached the engine
    (decoded,) = (tmp_path / "snd").glob("dump-*-dec.wav")  # what the phone heard
    assert loud_ms(decoded) >= 1500, loud_ms(decoded)  # the echo of a 3.7 s utterance
    assert transport.latch.latched is not None and transport.latch.latched[0] == "127.0.0.1"  # sent where its RTP came from
    assert codec.jitter.late == 0 and codec.malformed == 0


@pytest.mark.long
async def test_the_agent_calls_baresip_which_answers_and_hears_it(tmp_path: Path) -> None:
    """A call the agent places (#42) to a real SIP phone that answers by itself (``answermode=auto``): the phone's
    microphone (the WAV file) reaches the engine, the agent's reply is in what the phone recorded, and the phone's
    BYE at the end of its file ends the call."""
    caller_wav = microphone(tmp_path / "callee.wav")
    phone_port = free_port()
    config = configure(tmp_path, caller_wav, account="<sip:+15005550123@127.0.0.1>;regint=0;answermode=auto", port=phone_port)
    recorder = engine()
    dialing = settings(
        sip={"enabled": True, "port": free_port(), **RTP_PORTS, "outbound": {"trunk": f"sip:127.0.0.1:{phone_port}"}},
        outbound={"api_token": TOKEN},
    )
    async with running_bridge(dialing, recorder, provider="twilio") as bridge:
        output = await call_baresip(bridge, config)
        sip = listener(bridge)
        _, codec, transport = sip.finished[0]
    log = output.decode(errors="replace")
    assert "Call established" in log or "call established" in log.lower(), log[-2000:]
    (session_id,) = recorder.opened
    appended = [c for c in recorder.commands[session_id] if isinstance(c, AppendAudio)]
    heard_s = sum(len(c.pcm) for c in appended) / (2 * appended[0].rate_hz)
    assert heard_s > SPEECH_S, heard_s  # the callee's whole utterance reached the engine
    (decoded,) = (tmp_path / "snd").glob("dump-*-dec.wav")  # what the phone heard
    assert loud_ms(decoded) >= 1500, loud_ms(decoded)  # the echo of a 3.7 s utterance
    assert codec.jitter.late == 0 and codec.malformed == 0 and transport.send_errors == 0


@pytest.mark.long
async def test_baresip_calls_over_mutual_tls_and_hears_the_echo_agent(tmp_path: Path) -> None:
    """baresip dials ``sip:agent@…;transport=tls`` trusting the test CA (``sip_cafile``), and presents its own
    certificate (``sip_certificate``, from a second CA) where the bridge asks for one (``sip.tls_client_ca_file``,
    mutual TLS): its call is answered over TLS and it hears the echo agent, as over UDP."""
    import trustme  # the test extra

    from tests.sip.test_tls import issue

    pki = issue(tmp_path)
    (tmp_path / "ca.pem").write_bytes(pki.ca.cert_pem.bytes())
    phones = trustme.CA()
    (tmp_path / "phones-ca.pem").write_bytes(phones.cert_pem.bytes())
    phone = phones.issue_cert("phone.example.com")
    (tmp_path / "phone.pem").write_bytes(b"".join(blob.bytes() for blob in phone.cert_chain_pems) + phone.private_key_pem.bytes())
    caller_wav = microphone(tmp_path / "caller.wav")
    config = configure(tmp_path, caller_wav, extra=(f"sip_cafile {tmp_path / 'ca.pem'}", f"sip_certificate {tmp_path / 'phone.pem'}"))
    values = {
        "enabled": True, "port": free_port(), "tls_port": free_port(), **RTP_PORTS,
        "tls_certificate": str(pki.certificate), "tls_private_key": str(pki.private_key),
        "tls_client_ca_file": str(tmp_path / "phones-ca.pem"),
    }  # fmt: skip
    async with running_bridge(settings(sip=values), engine(), provider="twilio") as bridge:
        uri = f"sip:agent@127.0.0.1:{bridge.settings.sip.tls_port};transport=tls"
        output = await dial_from_baresip(config, uri)
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
        assert sip.tls is not None and sip.tls.served == 1 and not sip.dropped, sip.dropped  # the call came over TLS
    log = output.decode(errors="replace")
    assert "Call established" in log, log[-2000:]
    (decoded,) = (tmp_path / "snd").glob("dump-*-dec.wav")
    assert loud_ms(decoded) >= 1500, loud_ms(decoded)


def _port_pair() -> int:
    """A free port whose next is free too: baresip listens for TLS one above its ``sip_listen`` port."""
    import socket

    while True:
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


@pytest.mark.long
@pytest.mark.parametrize("srtp", [False, True], ids=["rtp", "srtp"])
async def test_the_agent_calls_baresip_over_tls_which_answers_and_hears_it(tmp_path: Path, srtp: bool) -> None:
    """A call the agent places over TLS (``sip.outbound.transport = "tls"``, the test CA in ``tls_ca_file``) to
    baresip listening with a certificate for 127.0.0.1: answered, the agent heard, the phone's BYE on the same
    connection ends the call. ``srtp``: with ``sip.media_encryption = "required"`` our offer is SRTP (SDES, our key),
    and baresip, taking only SRTP (``mediaenc=srtp-mand``), answers it in kind: the agent is heard through it."""
    from tests.sip.test_tls import issue

    pki = issue(tmp_path)
    (tmp_path / "phone.pem").write_bytes(pki.certificate.read_bytes() + pki.private_key.read_bytes())
    (tmp_path / "ca.pem").write_bytes(pki.ca.cert_pem.bytes())
    phone_port = _port_pair()
    account = "<sip:+15005550123@127.0.0.1>;regint=0;answermode=auto" + (";mediaenc=srtp-mand" if srtp else "")
    extra = (f"sip_certificate {tmp_path / 'phone.pem'}", *(["module srtp.so"] if srtp else []))
    config = configure(tmp_path, microphone(tmp_path / "callee.wav"), account=account, port=phone_port, extra=extra)
    outbound = {"trunk": f"sip:127.0.0.1:{phone_port + 1}", "transport": "tls", "tls_ca_file": str(tmp_path / "ca.pem")}
    encryption = {"media_encryption": "required"} if srtp else {}
    sip_values = {"enabled": True, "port": free_port(), **RTP_PORTS, "outbound": outbound, **encryption}
    async with running_bridge(settings(sip=sip_values, outbound={"api_token": TOKEN}), engine(), provider="twilio") as bridge:
        output = await call_baresip(bridge, config)
        sip = listener(bridge)
        assert not sip.dropped, sip.dropped  # no TLS connection refused, no SRTP packet
        _, codec, transport = sip.finished[0]
    log = output.decode(errors="replace")
    assert "call established" in log.lower(), log[-2000:]
    assert (transport.srtp is not None) == srtp and (codec.choice.proto == "RTP/SAVP") == srtp
    (decoded,) = (tmp_path / "snd").glob("dump-*-dec.wav")
    assert loud_ms(decoded) >= 1500, loud_ms(decoded)


async def call_over_tls_with_srtp_required(
    tmp_path: Path, caller_wav: Path, recorder: Any, codecs: tuple[str, ...] = ("g711",), sip_codecs: tuple[str, ...] = ()
) -> tuple[str, SipRtpCodec, RtpTransport]:
    """baresip with ``codecs`` (its modules) and ``mediaenc=srtp-mand`` (SDES keys in its offer), trusting the test CA,
    dials the bridge's TLS port where ``sip.media_encryption`` is ``required`` (and ``sip.codecs`` is ``sip_codecs``
    where given), with ``caller_wav`` as its microphone; what it printed, and the call's RTP codec and transport once
    it ended (no SRTP packet and no TLS connection refused)."""
    from tests.sip.test_tls import issue

    pki = issue(tmp_path)
    (tmp_path / "ca.pem").write_bytes(pki.ca.cert_pem.bytes())
    config = configure(
        tmp_path, caller_wav, account="<sip:caller@127.0.0.1>;regint=0;mediaenc=srtp-mand",
        extra=(f"sip_cafile {tmp_path / 'ca.pem'}", "module srtp.so"), codecs=codecs,
    )  # fmt: skip
    values = {
        "enabled": True, "port": free_port(), "tls_port": free_port(), **RTP_PORTS, "media_encryption": "required",
        "tls_certificate": str(pki.certificate), "tls_private_key": str(pki.private_key),
        **({"codecs": list(sip_codecs)} if sip_codecs else {}),
    }  # fmt: skip
    async with running_bridge(settings(sip=values), recorder, provider="twilio") as bridge:
        output = await dial_from_baresip(config, f"sip:agent@127.0.0.1:{bridge.settings.sip.tls_port};transport=tls")
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
        _, codec, transport = sip.finished[0]
        assert not sip.dropped, sip.dropped  # no SRTP packet refused, no TLS connection
    return output.decode(errors="replace"), codec, transport


@pytest.mark.long
async def test_baresip_calls_over_tls_with_srtp_required_and_hears_the_echo_agent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """baresip with ``mediaenc=srtp-mand`` (SDES keys in its offer, ``RTP/SAVP``) over TLS: the bridge answers in kind
    with a key of its own (``sip.media_encryption = "required"``), every packet both ways is SRTP, and the phone hears
    the echo agent. Neither key is in any line the bridge logged (every level: the tests' logging keeps debug)."""
    log, codec, transport = await call_over_tls_with_srtp_required(tmp_path, microphone(tmp_path / "caller.wav"), engine())
    assert "Call established" in log, log[-2000:]
    srtp = transport.srtp
    assert srtp is not None and srtp.keys.suite == "AES_CM_128_HMAC_SHA1_80"  # baresip's first choice
    logged = capsys.readouterr().out
    assert "sip_call_ended" in logged or "sip_stopped" in logged, logged[-2000:]  # the bridge's lines were captured
    for key in (srtp.keys.local_key, srtp.keys.remote_key):  # as SDP carries it (base64), and as bytes would print
        for form in (base64.b64encode(key).decode(), base64.b64encode(key).decode()[:20], key.hex(), repr(key)[2:30]):
            assert form not in logged
    # every RTP packet of the phone's authenticated (none dropped, above); what baresip 1.0 sends on the RTCP port
    # unprotected (an APP "PING" keepalive, its BYE) is refused, as a forged packet would be
    assert codec.malformed == 0 and codec.jitter.late == 0
    (decoded,) = (tmp_path / "snd").glob("dump-*-dec.wav")
    assert loud_ms(decoded) >= 1500, loud_ms(decoded)  # the agent's SRTP, decrypted by the phone


WIDEBAND_TONE_HZ = 6000
"""Past G.711's band (it ends below 4 kHz): only a wideband call carries it to the model."""


def wideband_microphone(path: Path, rate_hz: int = 16000, channels: int = 1) -> Path:
    """The bundled utterance at ``rate_hz`` (baresip's ``aufile`` takes the codec's rate and channels: 48000 and 2
    for Opus) with a 6 kHz tone under it, then 6 s of silence. Under it, not after it: the turn is the utterance's, so
    the echo agent's reply carries the tone, and a tone of its own after the utterance would be a second turn (or a
    barge-in on the reply, where the engine ends the turn in a pause before it)."""
    up = StreamResampler(8000, rate_hz, ResamplerQuality.HQ)
    speech = np.frombuffer(up.process(load_wav_8k(sample_caller_wav())) + up.flush(), dtype="<i2").astype(np.float64)
    whistle = 1500 * np.sin(2 * np.pi * WIDEBAND_TONE_HZ * np.arange(len(speech)) / rate_hz)
    both = np.clip(speech + whistle, -32768, 32767).astype("<i2").tobytes()
    return _wav(path, rate_hz, both + bytes(2 * rate_hz * 6), channels)


def band_share(pcm: bytes, rate_hz: int, low_hz: float, high_hz: float) -> float:
    """The share of ``pcm``'s energy between ``low_hz`` and ``high_hz``."""
    spectrum = np.abs(np.fft.rfft(np.frombuffer(pcm, dtype="<i2").astype(np.float64))) ** 2
    hz = np.fft.rfftfreq(len(pcm) // 2, 1 / rate_hz)
    return float(spectrum[(hz >= low_hz) & (hz <= high_hz)].sum() / spectrum.sum())


@pytest.mark.long
@pytest.mark.parametrize("module", ["g722", pytest.param("opus", marks=NEEDS_LIBOPUS)])
async def test_baresip_offering_only_a_wideband_codec_over_tls_with_srtp_required_gets_a_wideband_call_end_to_end(
    tmp_path: Path, module: str
) -> None:
    """baresip with only its ``g722`` (or ``opus``) module offers that codec alone, over TLS with SRTP required
    (``mediaenc=srtp-mand``): the bridge answers ``G722/8000`` (``opus/48000/2``, with ``opus`` in ``sip.codecs``) in
    ``RTP/SAVP``, the caller's 6 kHz tone (which no G.711 call carries) reaches the engine, and the echo agent's
    reply, tone and all, reaches the phone: energy above 4 kHz in what it decoded."""
    recorder = engine()
    wav = wideband_microphone(tmp_path / "caller.wav", *((48000, 2) if module == "opus" else (16000, 1)))
    sip_codecs = ("PCMU", "opus") if module == "opus" else ()
    log, codec, transport = await call_over_tls_with_srtp_required(tmp_path, wav, recorder, (module,), sip_codecs)
    assert "Call established" in log, log[-2000:]
    assert codec.choice.encoding is {"g722": AudioEncoding.G722, "opus": AudioEncoding.OPUS}[module]
    assert transport.srtp is not None and codec.choice.proto == "RTP/SAVP"
    assert codec.malformed == 0 and codec.other_payload_types == 0
    media = transport.media_quality()  # the report's line (#43): baresip's SRTCP reports give the round trip
    assert media is not None and (media.codec, media.encryption) == ({"g722": "G722", "opus": "opus"}[module], "srtp")
    assert media.packets_lost == 0 and media.round_trip_ms is not None and media.round_trip_ms < 100 and media.mos >= 4.2, media
    (session_id,) = recorder.opened
    appended = [c for c in recorder.commands[session_id] if isinstance(c, AppendAudio)]
    rate_hz = appended[0].rate_hz
    heard = b"".join(c.pcm for c in appended)
    assert len(heard) / (2 * rate_hz) > SPEECH_S  # the utterance, the tone under it
    share = band_share(heard, rate_hz, WIDEBAND_TONE_HZ - 200, WIDEBAND_TONE_HZ + 200)
    assert rate_hz >= 16000 and share > 0.05, (rate_hz, share)  # the tone came through (0.12 with either codec here)
    (decoded,) = (tmp_path / "snd").glob("dump-*-dec.wav")
    with wave.open(str(decoded)) as recording:
        played_hz = recording.getframerate()  # 16000 for G.722; baresip decodes Opus at 48000, in stereo
        played = np.frombuffer(recording.readframes(recording.getnframes()), dtype="<i2")[:: recording.getnchannels()].tobytes()
    assert played_hz >= 16000 and loud_ms(decoded) >= 1500, (played_hz, loud_ms(decoded))
    above = band_share(played, played_hz, 4000, 8000)
    assert above > 0.05, above  # the agent's voice reached the phone wideband (G.711 ends below 4 kHz; 0.11 here)
