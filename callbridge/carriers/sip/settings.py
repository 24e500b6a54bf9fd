"""``[sip]``: the SIP trunk section of the settings (``CALLBRIDGE_SIP__…``)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SecretStr

from callbridge.codecs import AudioEncoding
from callbridge.codecs.opus import problem as opus_problem
from callbridge.config_types import Host, Network, Port, Section

__all__ = ["SipOutboundSettings", "SipRegistrationSettings", "SipSettings"]


_ENCRYPTION_SPELLINGS = {"disable": "none", "allow": "optional", "require": "required"}
"""``media_encryption``'s other spellings (LiveKit's, and #43's), each taken as ours."""


def _encryption(value: object) -> object:
    return _ENCRYPTION_SPELLINGS.get(value, value) if isinstance(value, str) else value


class SipRegistrationSettings(Section):
    """One binding of the SIP listener at a registrar (a PBX or trunk that only sends calls to registered
    contacts): ``callbridge.sip.registration``."""

    registrar: str
    """The registrar's URI, ``sip:host[:port]`` (also where the REGISTERs go, without ``outbound_proxy``)."""
    aor: str
    """The address-of-record to bind, ``sip:user@domain``."""
    auth_user: str | None = None
    """The digest user name; None: the AOR's user."""
    password: SecretStr | None = None
    expires_s: Annotated[int, Field(ge=1, le=2**31 - 1)] = 3600
    outbound_proxy: str | None = None
    """A proxy to send the REGISTERs through (``sip:host[:port]``, put in Route)."""
    transport: Literal["udp", "tcp", "tls"] = "udp"
    """udp: from the listener's socket; tcp: over a connection to the registrar, which may send calls on it; tls: the
    same over TLS (port 5061 where the URI names none; our Contact is the TLS port, ``;transport=tls``), the
    registrar's certificate checked against its host name, ours presented where ``sip.tls_certificate`` is set."""
    tls_ca_file: Path | None = None
    """The CAs (PEM) the registrar's certificate must chain to over TLS; None: the system's."""
    retry_base_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    retry_max_s: Annotated[float, Field(gt=0, le=86400)] = 1800.0
    """After a failure, the next try waits min(retry_max_s, retry_base_s · 2^(failures−1)), 50–100 % of it."""

    def model_post_init(self, context: Any) -> None:
        for key in ("registrar", "aor", "outbound_proxy"):
            value = getattr(self, key)
            if value is not None and not value.lower().startswith("sip:"):
                raise ValueError(f"{key}: {value!r} is not a sip: URI")
        if "@" not in self.aor:
            raise ValueError(f"aor: {self.aor!r} has no user part (sip:user@domain)")


class SipOutboundSettings(Section):
    """The calls the agent places through the SIP trunk (``callbridge call --carrier sip``, ``POST /calls``): an
    INVITE to ``sip:<to>@<trunk host>``, from ``sip:<from>@<from_domain>`` (``callbridge.sip.uac``)."""

    trunk: str | None = None
    """The trunk's URI, ``sip:host[:port]``; None: the SIP listener places no calls."""
    outbound_proxy: str | None = None
    """A proxy every INVITE goes through (``sip:host[:port]``, put in Route); None: straight to the trunk."""
    from_domain: str | None = None
    """The From URI's host; None: the trunk's."""
    username: str | None = None
    password: SecretStr | None = None
    """Digest credentials for the trunk's 401 / 407 challenges."""
    transport: Literal["udp", "tcp", "tls"] = "udp"
    """udp: from the listener's socket; tcp: over a connection to the trunk (or proxy), opened for it; tls: the same
    over TLS (port 5061 where the URI names none), the trunk's certificate checked against its host name."""
    tls_ca_file: Path | None = None
    """The CAs (PEM) the trunk's certificate must chain to over TLS; None: the system's. Where the trunk asks for
    ours (mutual TLS), ``sip.tls_certificate`` is presented."""

    def model_post_init(self, context: Any) -> None:
        for key in ("trunk", "outbound_proxy"):
            value = getattr(self, key)
            if value is not None and (not value.lower().startswith("sip:") or "@" in value):
                raise ValueError(f"{key}: {value!r} is not a sip:host[:port] URI")
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")


class SipSettings(Section):
    """SIP trunk ingress: a UDP user-agent server, one RTP port per call (``callbridge.sip``)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: Port = 5060
    public_address: Host | None = None
    """The address the trunk reaches us at (Contact, SDP ``c=``); None: ``host``."""
    allowed_ips: list[Network] = Field(default_factory=lambda: ["127.0.0.1/32", "::1/128"])
    """CIDRs whose INVITEs are admitted without credentials."""
    username: str | None = None
    password: SecretStr | None = None
    realm: str = "callbridge"
    rtp_port_min: Port = 20000
    rtp_port_max: Port = 20999
    answer_delay_ms: Annotated[int, Field(ge=0, le=30000)] = 0
    """Ring (180) this long before answering; 0: answer at once."""
    rtp_timeout_s: Annotated[float, Field(ge=0, le=3600)] = 30.0
    """A call whose peer sends no RTP for this long (unless it holds the call) is ended with a BYE; 0: never. Time
    this process itself did not run (stopped, its VM frozen) is not taken for the peer's silence: the verdict waits
    until what came meanwhile is read."""
    outbound: SipOutboundSettings = Field(default_factory=SipOutboundSettings)
    """Calls placed through the trunk (#42): none unless ``outbound.trunk`` is set."""
    registrations: list[SipRegistrationSettings] = Field(default_factory=list)
    """Registrars to keep our contact bound at (REGISTER, refreshed; un-REGISTER at drain and shutdown)."""
    source_requests_per_s: Annotated[float, Field(gt=0)] = 200.0
    """SIP datagrams one source address may send a second (twice that in a burst); beyond, dropped unread."""
    requests_per_s: Annotated[float, Field(gt=0)] = 2000.0
    """SIP datagrams the listener reads a second from all sources together (twice that in a burst)."""
    media_encryption: Annotated[Literal["none", "optional", "required"], BeforeValidator(_encryption)] = "optional"
    """SRTP with SDES keys (RFC 4568, #43; ``disable``, ``allow`` and ``require`` are taken for ``none``, ``optional``
    and ``required``): an offer of ``RTP/SAVP`` with a key we take is answered in kind
    (``optional``, ``required``); where ``required``, an offer of plain RTP is refused 488, and our own offers (the
    calls placed, the 200 to an INVITE without SDP) are SRTP (``RTP/SAVP``, one crypto line with our key: an answer
    not in kind ends the call); where ``optional``, they offer plain RTP, which every trunk takes; ``none``: plain RTP only. The keys travel in
    the SDP: without TLS signalling anyone on the path reads them."""
    codecs: Annotated[list[Literal["PCMU", "PCMA", "G722", "opus"]], Field(min_length=1, max_length=4)] = ["PCMU", "PCMA", "G722"]
    """The audio codecs a call may use (#43): an offer's first one of these is taken (the offerer's preference,
    RFC 3264), and our own offers (a delayed offer's answer, the calls placed) list them in this order. G722 is
    wideband (16 kHz audio: the model hears the caller's consonants), at 64 kbit/s like G.711; put it first for
    the calls we place to prefer it. ``opus`` is wideband too (coded at 16 kHz, 32 kbit/s, FEC on: what loses
    least on a lossy path), but not in the default: it needs libopus (Debian: ``libopus0``; ``callbridge config
    check`` says when it is missing) and a call costs more CPU (``bench/wideband_cost.py``). An offer with none of
    them is refused 488."""
    opus_fec: bool = True
    """An Opus call's packets carry in-band FEC (each has the last one again, coarser: a peer that lost one rebuilds
    it from the next, RFC 7587's ``useinbandfec``). It costs CPU: the RTP edge of an Opus call took 12.2 CPU-ms a
    call-second with it and 7.1 without, a G.711 call's 0.8 (``bench/wideband_cost.py``, speech both ways all the
    time, session 42's machine). Off where CPU counts more than a lossy last mile. What we receive is rebuilt from the peer's FEC either
    way."""
    quality_floor_mos: Annotated[float, Field(ge=1.0, le=4.5)] = 3.6
    """A call whose line's MOS estimate (the E-model's, from loss, jitter and round trip: ``callbridge/sip/
    call_quality.py``) falls below this is logged once, ``sip_call_quality_low``, with its figures (about 7 % loss
    at a short round trip, or 2 % beside a 600 ms one). Every SIP call's report has the figures (``media``)."""
    tls_certificate: Path | None = None
    """SIP over TLS (#43): this certificate (PEM, the chain after it) and ``tls_private_key`` — a TLS listener on
    ``tls_port``, beside UDP and TCP on ``port``. Read again when either file changes (the next connection's
    handshake has the new one: a renewed certificate needs no restart)."""
    tls_private_key: Path | None = None
    tls_port: Port = 5061
    tls_client_ca_file: Path | None = None
    """Mutual TLS on ``tls_port``: a peer must present a certificate that chains to these CAs (PEM; the trunk's, or
    the CA that issued it), else its handshake fails (``callbridge_sip_dropped_total{reason="tls_handshake_failed"}``).
    On top of ``allowed_ips`` and digest credentials, not instead: a source that could never call is still closed
    before a byte of TLS. Read again with the certificate when it changes. None: no certificate asked of peers.
    Our side of mutual TLS, where a trunk or registrar asks for it, is ``tls_certificate``."""
    tls_handshake_timeout_s: Annotated[float, Field(gt=0, le=60)] = 5.0
    """A connection that has not finished its handshake by then is closed (it holds a socket and a little state)."""
    max_tls_connections: Annotated[int, Field(ge=1)] = 256
    """TLS connections open at once, at most (a trunk keeps one or a few); past it a new one is closed at once."""
    receive_buffer_bytes: Annotated[int, Field(ge=65536)] = 4 * 1024 * 1024
    """The SIP socket's receive buffer (``SO_RCVBUF``), so a burst waits in the kernel rather than being lost;
    the kernel caps it at ``net.core.rmem_max`` unless the process may force it (logged at start)."""

    def model_post_init(self, context: Any) -> None:
        if self.rtp_port_max < self.rtp_port_min + 1:
            raise ValueError("rtp_port_max must be above rtp_port_min")
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        if (self.tls_certificate is None) != (self.tls_private_key is None):
            raise ValueError("tls_certificate and tls_private_key go together")
        for index, registration in enumerate(self.registrations):
            if registration.transport == "tls" and self.tls_certificate is None:
                raise ValueError(f"registrations.{index}.transport = tls needs tls_certificate and tls_private_key (our Contact is the TLS listener)")
        if self.tls_client_ca_file is not None and self.tls_certificate is None:
            raise ValueError("tls_client_ca_file needs tls_certificate and tls_private_key (the TLS listener it asks peers' certificates on)")
        if len(set(self.codecs)) != len(self.codecs):
            raise ValueError(f"codecs: {self.codecs!r} names a codec twice")

    @property
    def tls(self) -> bool:
        """SIP over TLS is configured (a certificate and its key)."""
        return self.tls_certificate is not None

    def listeners_beside_port(self) -> list[tuple[str, int]]:
        """The listeners this section opens besides ``port`` (``preflight.listener_problems`` binds each first):
        the TLS port, where TLS is configured."""
        return [("tls_port", self.tls_port)] if self.tls else []

    @property
    def encodings(self) -> tuple[AudioEncoding, ...]:
        """``codecs`` as the SDP code takes them."""
        return tuple(AudioEncoding[name.upper()] for name in self.codecs)

    def file_problems(self, now: datetime) -> list[str]:
        """What is wrong with the files this section names (the TLS certificate and key, the CA files, the Opus
        library where ``codecs`` names it), one sentence each."""
        if not self.enabled:
            return []
        from callbridge.carriers.sip.tls import ca_file_problems, certificate_problems

        problems: list[str] = []
        if "opus" in self.codecs and (missing := opus_problem()) is not None:
            problems.append(f"sip.codecs names opus: {missing}")
        if self.tls_certificate is not None and self.tls_private_key is not None:
            problems += [f"sip.tls_certificate: {problem}" for problem in certificate_problems(self.tls_certificate, self.tls_private_key, now)]
        ca_files = [("sip.tls_client_ca_file", self.tls_client_ca_file), ("sip.outbound.tls_ca_file", self.outbound.tls_ca_file)]
        ca_files += [(f"sip.registrations.{index}.tls_ca_file", each.tls_ca_file) for index, each in enumerate(self.registrations)]
        for key, path in ca_files:
            if path is not None:
                problems += [f"{key}: {problem}" for problem in ca_file_problems(path, now)]
        return problems
