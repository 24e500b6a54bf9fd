"""SDP offer/answer for one audio stream, G.711, G.722 or Opus (RFC 3264; syntax RFC 8866; telephony-protocols.md §5.2).

``choose(offer)`` reads an offer and picks what we take: the first audio
stream with a port, the first of its codecs we take (``codecs``, from
``sip.codecs``: PCMU, PCMA, G.722, Opus — in the offer's order, the offerer's
preference, RFC 3264 §6.1), and telephone-event if offered (at the codec's
clock where offered so, else at 8000), with the offer's payload-type numbers. None:
nothing fits (the caller answers ``488``). ``answer(...)`` writes our answer:
the same number and order of ``m=`` lines, every stream but the chosen one
rejected with port 0, exactly one audio codec (plus telephone-event), the
answering direction (``sendonly`` → ``recvonly``, …). Any ``ptime`` the peer
uses is accepted: the receiver derives durations from payload sizes.

SRTP (``encryption``, ``sip.media_encryption``): an ``RTP/SAVP`` (or ``RTP/SAVPF``) stream with an ``a=crypto`` line we
take (``srtp.parse_crypto``) is taken unless encryption is ``none``, and answered in kind with our key
(``MediaChoice.srtp``); a plain ``RTP/AVP`` stream is not taken where it is ``required``. Streams are weighed in the
offer's order, so an offer of SRTP first with RTP as the fallback gets SRTP where we may.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass
from typing import Final, Literal

from callbridge.codecs import AudioEncoding
from callbridge.sip.srtp import OFFER_CRYPTO_TAG, OFFER_SUITE, SrtpKeys, offer_line, parse_crypto, pick

__all__ = [
    "CLOCK_HZ", "DEFAULT_CODECS", "OFFER_DTMF_PT", "OFFER_OPUS_PT", "OPUS_FMTP", "Direction", "Encryption", "MediaChoice", "SdpError",
    "answer", "choose", "codec_name", "offer", "read_answer",
]  # fmt: skip

Encryption = Literal["none", "optional", "required"]
"""Whether a call's media may (``optional``), must (``required``) or may not (``none``) be SRTP."""
_PLAIN: Final = ("RTP/AVP", "RTP/AVPF")
_SECURE: Final = ("RTP/SAVP", "RTP/SAVPF")

_STATIC: Final = {0: AudioEncoding.PCMU, 8: AudioEncoding.PCMA, 9: AudioEncoding.G722}
_NAMES: Final = {"PCMU": AudioEncoding.PCMU, "PCMA": AudioEncoding.PCMA, "G722": AudioEncoding.G722, "OPUS": AudioEncoding.OPUS}
CLOCK_HZ: Final = {AudioEncoding.PCMU: 8000, AudioEncoding.PCMA: 8000, AudioEncoding.G722: 8000, AudioEncoding.OPUS: 48000}
"""Each codec's RTP clock. G.722's is 8000 though its audio is sampled at 16000 (RFC 3551 §4.5.2); Opus's is 48000
whatever its audio's rate (RFC 7587 §4.1)."""
_RTPMAP: Final = {encoding: f"{encoding.name}/{hz}" for encoding, hz in CLOCK_HZ.items()} | {AudioEncoding.OPUS: "opus/48000/2"}
"""Opus is always "opus/48000/2", mono or not (RFC 7587 §7)."""
OPUS_FMTP: Final = "useinbandfec=1;maxplaybackrate=16000;sprop-maxcapturerate=16000"
"""What we say of Opus in our SDP: we decode its in-band FEC, play it at 16 kHz and capture at 16 kHz (so the peer
need not spend bits above 8 kHz: the engine hears 16 kHz)."""
OFFER_OPUS_PT: Final = 111
"""Opus's payload type in our own offers (dynamic: no static one exists)."""
_PAYLOAD_TYPE: Final = {encoding: pt for pt, encoding in _STATIC.items()} | {AudioEncoding.OPUS: OFFER_OPUS_PT}
DEFAULT_CODECS: Final = (AudioEncoding.PCMU, AudioEncoding.PCMA, AudioEncoding.G722)
"""``sip.codecs``' default: what we take, and offer in this order."""


def codec_name(encoding: AudioEncoding) -> str:
    """A codec's name as SDP spells it (``sip.codecs`` too): "PCMU", "G722", "opus"."""
    return _RTPMAP[encoding].partition("/")[0]


class SdpError(Exception):
    """The body is not an SDP session description we can read."""


class Direction(enum.Enum):
    SENDRECV = "sendrecv"
    SENDONLY = "sendonly"
    RECVONLY = "recvonly"
    INACTIVE = "inactive"

    def answer(self) -> Direction:
        return _ANSWER_DIRECTION[self]

    @property
    def we_send(self) -> bool:
        """Whether, in an answer with this direction, we send media."""
        return self in (Direction.SENDRECV, Direction.SENDONLY)

    @property
    def peer_sends(self) -> bool:
        """Whether, in an answer with this direction, the peer sends us media."""
        return self in (Direction.SENDRECV, Direction.RECVONLY)


_ANSWER_DIRECTION: Final = {
    Direction.SENDRECV: Direction.SENDRECV,
    Direction.SENDONLY: Direction.RECVONLY,
    Direction.RECVONLY: Direction.SENDONLY,
    Direction.INACTIVE: Direction.INACTIVE,
}


@dataclass(frozen=True, slots=True)
class MediaChoice:
    """What we take from an offer: the codec and its payload type, telephone-event's, where to send, and our
    direction (already the answer's)."""

    encoding: AudioEncoding
    payload_type: int
    dtmf_payload_type: int | None
    remote_host: str
    remote_port: int
    direction: Direction
    ptime_ms: int | None
    media_index: int
    """Which ``m=`` line (0-based) carries it."""
    media_lines: tuple[str, ...]
    """Every ``m=`` line of the offer (kept to answer with the same number and order)."""
    srtp: SrtpKeys | None = None
    """The stream is SRTP: the offer's key and ours (None: plain RTP)."""
    proto: str = "RTP/AVP"
    """The chosen stream's transport protocol, answered in kind."""
    dtmf_clock_hz: int = 8000
    """telephone-event's RTP clock (its durations count in it): 8000, or the codec's where offered so."""

    @property
    def clock_hz(self) -> int:
        """The codec's RTP clock: timestamps advance by this a second."""
        return CLOCK_HZ[self.encoding]


@dataclass(slots=True)
class _Media:
    line: str
    kind: str
    port: int
    proto: str
    formats: list[str]
    rtpmap: dict[int, str]
    crypto: list[str]
    host: str | None = None
    direction: Direction | None = None
    ptime_ms: int | None = None


def _number(text: str) -> int | None:
    """A field of ASCII digits (RFC 4566), or None: ``str.isdigit`` also holds for "²", which ``int`` refuses,
    and no SDP number here needs ten digits."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else None


def _parse(offer: str) -> tuple[str | None, Direction, list[_Media]]:
    session_host: str | None = None
    session_direction = Direction.SENDRECV
    media: list[_Media] = []
    saw_version = False
    for raw in offer.replace("\r\n", "\n").split("\n"):
        line = raw.strip()
        if not line:
            continue
        if len(line) < 2 or line[1] != "=":
            raise SdpError(f"not an SDP line: {line[:60]!r}")
        kind, value = line[0], line[2:]
        current = media[-1] if media else None
        if kind == "v":
            saw_version = value == "0"
        elif kind == "c":
            parts = value.split()
            if len(parts) != 3 or parts[0] != "IN":
                raise SdpError(f"bad c= line: {value!r}")
            host = parts[2].split("/")[0]
            if current is None:
                session_host = host
            else:
                current.host = host
        elif kind == "m":
            parts = value.split()
            port = _number(parts[1].split("/")[0]) if len(parts) >= 4 else None
            if port is None or port > 65535:
                raise SdpError(f"bad m= line: {value!r}")
            media.append(_Media(line, parts[0], port, parts[2], parts[3:], {}, []))
        elif kind == "a":
            name, _, rest = value.partition(":")
            if name in Direction._value2member_map_:
                if current is None:
                    session_direction = Direction(name)
                else:
                    current.direction = Direction(name)
            elif name == "rtpmap" and current is not None:
                pt_text, _, encoding = rest.partition(" ")
                if (pt := _number(pt_text)) is not None:
                    current.rtpmap[pt] = encoding.strip()
            elif name == "ptime" and current is not None and (ptime := _number(rest.strip())) is not None:
                current.ptime_ms = ptime
            elif name == "crypto" and current is not None:
                current.crypto.append(rest)
    if not saw_version:
        raise SdpError("no v=0 line")
    return session_host, session_direction, media


def choose(
    offer: str, *, encryption: Encryption = "optional", local_key: bytes | None = None, codecs: tuple[AudioEncoding, ...] = DEFAULT_CODECS
) -> MediaChoice | None:
    """What we take from ``offer`` (see the module docstring); None when no stream fits. ``local_key``: our SRTP key
    where the call has one already (a re-INVITE's), else a new one. Raises ``SdpError``."""
    session_host, session_direction, media = _parse(offer)
    for index, m in enumerate(media):
        if m.kind != "audio" or m.port == 0:
            continue
        srtp: SrtpKeys | None = None
        if m.proto in _SECURE and encryption != "none":
            offered = pick([c for c in map(parse_crypto, m.crypto) if c is not None])
            if offered is None:
                continue
            srtp = SrtpKeys.answering(offered, local_key)
        elif m.proto not in _PLAIN or encryption == "required":
            continue
        codec: tuple[AudioEncoding, int] | None = None
        events: dict[int, int] = {}
        """telephone-event's payload type at each clock offered (the first of each)."""
        for fmt in m.formats:
            pt = _number(fmt)
            if pt is None or pt > 127:
                continue
            name = m.rtpmap.get(pt, "")
            encoding_name, _, rate = name.partition("/")
            rate_hz = _number(rate.split("/")[0])
            if codec is None:
                if pt in _STATIC and (not name or (encoding_name.upper() == _STATIC[pt].name and rate_hz == 8000)):
                    codec = (_STATIC[pt], pt) if _STATIC[pt] in codecs else None
                elif (named := _NAMES.get(encoding_name.upper())) is not None and rate_hz == CLOCK_HZ[named] and pt >= 96:
                    codec = (named, pt) if named in codecs else None
            if encoding_name.lower() == "telephone-event" and rate_hz is not None:
                events.setdefault(rate_hz, pt)
        if codec is None:
            continue
        dtmf_clock_hz = CLOCK_HZ[codec[0]] if CLOCK_HZ[codec[0]] in events else 8000
        dtmf = events.get(dtmf_clock_hz)
        host = m.host or session_host
        if host is None:
            raise SdpError("no c= line for the audio stream")
        try:
            ipaddress.ip_address(host)
        except ValueError:  # a host name would need a (blocking) DNS lookup per packet: trunks send addresses
            raise SdpError(f"c= address {host[:60]!r} is not an IP address") from None
        direction = m.direction or session_direction
        if host in ("0.0.0.0", "::"):  # RFC 2543 hold
            direction = Direction.INACTIVE if direction is Direction.RECVONLY else Direction.SENDONLY
        return MediaChoice(
            encoding=codec[0],
            payload_type=codec[1],
            dtmf_payload_type=dtmf,
            remote_host=host,
            remote_port=m.port,
            direction=direction.answer(),
            ptime_ms=m.ptime_ms,
            media_index=index,
            media_lines=tuple(x.line for x in media),
            srtp=srtp,
            proto=m.proto,
            dtmf_clock_hz=dtmf_clock_hz,
        )
    return None


def _session_lines(host: str, session_id: int, version: int) -> list[str]:
    """The session-level lines of our SDP, offer or answer."""
    family = "IP6" if ":" in host else "IP4"
    return ["v=0", f"o=callbridge {session_id} {version} IN {family} {host}", "s=callbridge", f"c=IN {family} {host}", "t=0 0"]


def answer(choice: MediaChoice, *, host: str, port: int, session_id: int, version: int) -> str:
    """Our SDP answer (CRLF line ends)."""
    lines = _session_lines(host, session_id, version)
    for index, offered in enumerate(choice.media_lines):
        if index != choice.media_index:
            parts = offered[2:].split()
            lines.append(f"m={parts[0]} 0 {parts[2]} {parts[3] if len(parts) > 3 else '0'}")
            continue
        formats = [str(choice.payload_type)]
        if choice.dtmf_payload_type is not None:
            formats.append(str(choice.dtmf_payload_type))
        lines.append(f"m=audio {port} {choice.proto} {' '.join(formats)}")
        lines.append(f"a=rtpmap:{choice.payload_type} {_RTPMAP[choice.encoding]}")
        if choice.encoding is AudioEncoding.OPUS:
            lines.append(f"a=fmtp:{choice.payload_type} {OPUS_FMTP}")
        if choice.dtmf_payload_type is not None:
            lines.append(f"a=rtpmap:{choice.dtmf_payload_type} telephone-event/{choice.dtmf_clock_hz}")
            lines.append(f"a=fmtp:{choice.dtmf_payload_type} 0-15")
        lines.append("a=ptime:20")
        lines.append(f"a={choice.direction.value}")
        if choice.srtp is not None:
            lines.append(choice.srtp.answer_line())
    return "\r\n".join(lines) + "\r\n"


OFFER_DTMF_PT: Final = 101
"""telephone-event's payload type in our own offer (a delayed offer: the INVITE came without SDP)."""


def offer(
    *, host: str, port: int, session_id: int, version: int, codecs: tuple[AudioEncoding, ...] = DEFAULT_CODECS,
    srtp_key: bytes | None = None,
) -> str:
    """Our SDP offer, for an INVITE that had none (RFC 3261 §13.2.1: the answer comes in the ACK) and for the calls
    we place: ``codecs`` in their order (our preference) by their static payload types (Opus: ``OFFER_OPUS_PT``),
    telephone-event at 8000, 20 ms,
    sendrecv (CRLF line ends). ``srtp_key``: SRTP (``RTP/SAVP`` and one ``a=crypto`` line with this key of ours, what
    a placed call offers where ``sip.media_encryption`` is ``required``)."""
    types = [_PAYLOAD_TYPE[encoding] for encoding in codecs]
    proto = "RTP/SAVP" if srtp_key is not None else "RTP/AVP"
    lines = [
        *_session_lines(host, session_id, version),
        f"m=audio {port} {proto} {' '.join(map(str, types))} {OFFER_DTMF_PT}",
        *(f"a=rtpmap:{_PAYLOAD_TYPE[encoding]} {_RTPMAP[encoding]}" for encoding in codecs),
        *([f"a=fmtp:{OFFER_OPUS_PT} {OPUS_FMTP}"] if AudioEncoding.OPUS in codecs else []),
        f"a=rtpmap:{OFFER_DTMF_PT} telephone-event/8000",
        f"a=fmtp:{OFFER_DTMF_PT} 0-15",
        "a=ptime:20",
        "a=sendrecv",
        *([offer_line(srtp_key)] if srtp_key is not None else []),
    ]
    return "\r\n".join(lines) + "\r\n"


def read_answer(text: str, codecs: tuple[AudioEncoding, ...] = DEFAULT_CODECS, srtp_key: bytes | None = None) -> MediaChoice | None:
    """The peer's answer to ``offer(codecs=codecs, srtp_key=srtp_key)`` (RFC 3264 §6): what it took, or None when the
    answer is not one to our offer (a codec or telephone-event payload type we did not offer, no audio stream; to an
    SRTP offer, plain RTP, or a crypto line of another tag or suite). Raises ``SdpError``."""
    if srtp_key is None:
        choice = choose(text, encryption="none", codecs=codecs)  # we offered plain RTP
    else:
        choice = choose(text, encryption="required", local_key=srtp_key, codecs=codecs)
        if choice is not None and (choice.srtp is None or (choice.srtp.tag, choice.srtp.suite) != (OFFER_CRYPTO_TAG, OFFER_SUITE)):
            return None
    if choice is None or choice.payload_type != _PAYLOAD_TYPE[choice.encoding] or len(choice.media_lines) != 1:
        return None
    if choice.dtmf_payload_type not in (None, OFFER_DTMF_PT) or choice.dtmf_clock_hz != 8000:
        return None
    return choice
