"""SIP over TLS (#43): a trunk connects to ``sip.tls_port`` with a certificate from a test CA (trustme), places a
call and hangs it up, all on its TLS connection; what the listener refuses before a byte of TLS (a source that could
never call, past the connection cap) and a handshake that fails; a renewed certificate served without a restart."""

from __future__ import annotations

import asyncio
import secrets
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trustme

from callbridge.carriers.sip.sim_wire import SipReply, read_sip
from callbridge.carriers.sip.tls import TlsCertificate, TlsCertificateError
from callbridge.config import Settings
from callbridge.preflight import file_problems
from callbridge.sim.hostile import TLS_HELLO_START, RtpArrivals, stalled_tls_handshake
from callbridge.sim.ports import RTP_PORTS, free_port
from callbridge.sim.runner import RunningBridge, running_bridge
from callbridge.sip.message import split_stream
from tests.bridge.test_outbound_e2e import TOKEN, post_call
from tests.bridge.twilio_e2e import engine, settings, until
from tests.sip.test_sipp_e2e import listener


@dataclass
class Pki:
    ca: trustme.CA
    certificate: Path
    private_key: Path

    def client(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context

    def ca_file(self, directory: Path) -> Path:
        path = directory / "ca.pem"
        path.write_bytes(self.ca.cert_pem.bytes())
        return path


def issue(directory: Path, ca: trustme.CA | None = None) -> Pki:
    """A CA and a server certificate for 127.0.0.1 from it, written where ``sip.tls_certificate`` reads them."""
    ca = ca or trustme.CA()
    served = ca.issue_cert("127.0.0.1", "localhost")
    certificate, private_key = directory / "sip.crt", directory / "sip.key"
    served.private_key_pem.write_to_path(str(private_key))
    certificate.write_bytes(b"".join(blob.bytes() for blob in served.cert_chain_pems))
    return Pki(ca, certificate, private_key)


@asynccontextmanager
async def tls_bridge(pki: Pki, **sip: object) -> AsyncIterator[RunningBridge]:
    values = {
        "enabled": True, "port": free_port(), "tls_port": free_port(), **RTP_PORTS,
        "tls_certificate": str(pki.certificate), "tls_private_key": str(pki.private_key), **sip,
    }  # fmt: skip
    async with running_bridge(settings(sip=values), engine(), provider="twilio") as bridge:
        yield bridge


class Trunk:
    """A trunk's end of one TLS connection: requests written, messages read strictly."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._buffer = b""
        self._messages: list[bytes] = []
        host, port = writer.get_extra_info("sockname")[:2]
        self.local = f"{host}:{port}"

    async def read(self) -> SipReply:
        while not self._messages:
            chunk = await asyncio.wait_for(self.reader.read(65536), 10)
            assert chunk, "the bridge closed the connection"
            messages, self._buffer = split_stream(self._buffer + chunk)
            self._messages += messages
        reply = read_sip(self._messages.pop(0))
        assert isinstance(reply, SipReply), reply
        return reply

    async def final(self) -> SipReply:
        while (reply := await self.read()).status < 200:
            pass
        return reply

    def send(self, method: str, uri: str, call_id: str, cseq: int, *, to_tag: str = "", body: bytes = b"") -> None:
        lines = [
            f"{method} {uri} SIP/2.0",
            f"Via: SIP/2.0/TLS {self.local};branch=z9hG4bK{secrets.token_hex(8)};rport",
            "Max-Forwards: 70",
            "From: <sip:trunk@127.0.0.1>;tag=trunk1",
            f"To: <sip:agent@127.0.0.1>{';tag=' + to_tag if to_tag else ''}",
            f"Call-ID: {call_id}",
            f"CSeq: {cseq} {method}",
            f"Contact: <sip:trunk@{self.local};transport=tls>",
            *(["Content-Type: application/sdp"] if body else []),
            f"Content-Length: {len(body)}",
        ]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)


@asynccontextmanager
async def trunk(bridge: RunningBridge, context: ssl.SSLContext, *, local_host: str = "127.0.0.1") -> AsyncIterator[Trunk]:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", bridge.settings.sip.tls_port, ssl=context, server_hostname="127.0.0.1", local_addr=(local_host, 0)
    )
    try:
        yield Trunk(reader, writer)
    finally:
        writer.close()


def offer(rtp_port: int) -> bytes:
    lines = ["v=0", "o=trunk 1 1 IN IP4 127.0.0.1", "s=-", "c=IN IP4 127.0.0.1", "t=0 0", f"m=audio {rtp_port} RTP/AVP 0", "a=rtpmap:0 PCMU/8000", "a=sendrecv"]
    return ("\r\n".join(lines) + "\r\n").encode()


async def test_a_call_over_tls_is_answered_and_hung_up_on_its_connection(tmp_path: Path) -> None:
    """INVITE over TLS to a ``sips:`` URI: 200 OK on the same connection, its Contact the TLS port with ``;transport=tls`` (the trunk's
    requests in the dialog come back over TLS); ACK, then the trunk's BYE, answered 200 there too."""
    pki = issue(tmp_path)
    async with tls_bridge(pki) as bridge, trunk(bridge, pki.client()) as line:
        sip = listener(bridge)
        tls_port = bridge.settings.sip.tls_port
        uri = f"sips:agent@127.0.0.1:{tls_port}"  # baresip's test dials sip:…;transport=tls
        call_id = "tls-" + secrets.token_hex(6)
        line.send("INVITE", uri, call_id, 1, body=offer(free_port()))
        ok = await line.final()
        assert ok.status == 200, ok
        assert ok.get("contact") == f"<sip:callbridge@127.0.0.1:{tls_port};transport=tls>"
        assert ok.get("via").startswith("SIP/2.0/TLS ") and b"m=audio" in ok.body
        to_tag = ok.get("to").split("tag=")[1]
        line.send("ACK", uri, call_id, 1, to_tag=to_tag)
        await until(lambda: call_id in sip.calls)
        line.send("BYE", uri, call_id, 2, to_tag=to_tag)
        bye_ok = await line.final()
        assert (bye_ok.status, bye_ok.cseq) == (200, (2, "BYE"))
        await until(lambda: len(sip.finished) == 1)
        assert sip.tls is not None and sip.tls.open == 1 and not sip.dropped


async def test_what_the_tls_port_refuses_before_a_byte_of_tls_and_a_handshake_that_fails(tmp_path: Path) -> None:
    """Without digest credentials a source outside ``sip.allowed_ips`` could never place a call: its connection is
    closed before the handshake. Past ``sip.max_tls_connections`` a new one is closed at once. A client that does
    not trust the certificate, and one speaking plain SIP to the TLS port, fail their handshake: each counted, and
    a trusted trunk connects all the while."""
    pki = issue(tmp_path)
    async with tls_bridge(pki, max_tls_connections=2) as bridge:
        sip = listener(bridge)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            async with trunk(bridge, pki.client(), local_host="127.0.0.2"):
                pass
        await until(lambda: sip.dropped["tls_source_not_allowed"] == 1)
        with pytest.raises(ssl.SSLCertVerificationError):
            async with trunk(bridge, Pki(trustme.CA(), pki.certificate, pki.private_key).client()):
                pass
        reader, writer = await asyncio.open_connection("127.0.0.1", bridge.settings.sip.tls_port)
        writer.write(b"OPTIONS sip:agent@127.0.0.1 SIP/2.0\r\n\r\n")
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed: not TLS
        writer.close()
        await until(lambda: sip.dropped["tls_handshake_failed"] == 2)
        async with trunk(bridge, pki.client()), trunk(bridge, pki.client()):
            await until(lambda: sip.tls is not None and sip.tls.open == 2)
            with pytest.raises((ssl.SSLError, ConnectionError)):
                async with trunk(bridge, pki.client()):
                    pass
            assert sip.dropped["tls_too_many_connections"] == 1


async def test_a_renewed_certificate_is_served_to_the_next_connection_without_a_restart(tmp_path: Path) -> None:
    """The certificate's files replaced (by a new CA's, so that only the new one is trusted by the second client): the
    next handshake has it; a pair that cannot be read meanwhile leaves the one in use."""
    pki = issue(tmp_path)
    async with tls_bridge(pki) as bridge:
        sip = listener(bridge)
        async with trunk(bridge, pki.client()):
            pass
        pki.certificate.write_text("not a certificate")
        async with trunk(bridge, pki.client()):  # the unreadable pair left the one in use
            pass
        renewed = issue(tmp_path)
        async with trunk(bridge, renewed.client()):
            pass
        assert sip.tls is not None and sip.tls.certificate.reloads == 1
        with pytest.raises(ssl.SSLCertVerificationError):
            async with trunk(bridge, pki.client()):
                pass


@pytest.mark.core
def test_a_certificate_and_a_key_that_do_not_belong_together_are_refused(tmp_path: Path) -> None:
    pki = issue(tmp_path)
    other = trustme.CA().issue_cert("127.0.0.1")
    other.private_key_pem.write_to_path(str(pki.private_key))
    with pytest.raises(TlsCertificateError, match="sip.key"):
        TlsCertificate(pki.certificate, pki.private_key)


@pytest.mark.core
def test_config_check_says_what_is_wrong_with_a_certificate(tmp_path: Path) -> None:
    """``preflight.file_problems`` (``callbridge config check``, and ``serve`` before it starts): none for a good
    pair; one sentence each for a missing file, a file with no certificate, a key that is not the certificate's, an
    expired certificate and one not valid yet."""
    pki = issue(tmp_path)
    now = datetime.now(UTC)

    def problems(**sip: object) -> list[str]:
        values = {"enabled": True, "tls_certificate": str(pki.certificate), "tls_private_key": str(pki.private_key), **sip}
        return file_problems(Settings.model_validate({"sip": values}), now)

    assert problems() == []
    assert problems(enabled=False, tls_certificate=str(tmp_path / "none.crt")) == []  # SIP off: not looked at
    assert problems(tls_certificate=str(tmp_path / "none.crt")) == [f"sip.tls_certificate: {tmp_path / 'none.crt'} cannot be read: No such file or directory"]
    (tmp_path / "empty.crt").write_text("nothing here")
    assert problems(tls_certificate=str(tmp_path / "empty.crt")) == [f"sip.tls_certificate: {tmp_path / 'empty.crt'} holds no PEM certificate"]
    other = tmp_path / "other.key"
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other))
    (mismatch,) = problems(tls_private_key=str(other))
    assert mismatch.startswith(f"sip.tls_certificate: {other} is not the key of {pki.certificate}"), mismatch
    for name, window, said in (
        ("old", (now - timedelta(days=30), now - timedelta(days=1)), "expired on"),
        ("early", (now + timedelta(days=1), now + timedelta(days=30)), "is not valid before"),
    ):
        leaf = pki.ca.issue_cert("127.0.0.1", not_before=window[0], not_after=window[1])
        leaf.private_key_pem.write_to_path(str(tmp_path / f"{name}.key"))
        (tmp_path / f"{name}.crt").write_bytes(leaf.cert_chain_pems[0].bytes())
        (found,) = problems(tls_certificate=str(tmp_path / f"{name}.crt"), tls_private_key=str(tmp_path / f"{name}.key"))
        assert found.startswith(f"sip.tls_certificate: {tmp_path / f'{name}.crt'} {said} "), found


async def test_a_dial_over_tls_to_a_trunk_whose_certificate_is_not_trusted_sends_nothing(tmp_path: Path) -> None:
    """``sip.outbound.transport = "tls"`` with the system's CAs: the trunk's certificate (a test CA's) is refused in
    the handshake, counted and logged, and the INVITE never leaves (its timer then fails the dial); with the CA in
    ``tls_ca_file`` the same trunk gets it."""
    pki = issue(tmp_path)
    received: list[bytes] = []

    async def trunk_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(65536))
        writer.close()

    server = await asyncio.start_server(trunk_side, "127.0.0.1", 0, ssl=_server_context(pki))
    port = server.sockets[0].getsockname()[1]
    try:
        for ca_file, sent in ((None, False), (str(pki.ca_file(tmp_path)), True)):
            outbound = {"trunk": f"sip:127.0.0.1:{port}", "transport": "tls", "tls_ca_file": ca_file}
            values = {"enabled": True, "port": free_port(), **RTP_PORTS, "outbound": outbound}
            async with running_bridge(settings(sip=values, outbound={"api_token": TOKEN}), engine(), provider="twilio") as bridge:
                response = await post_call(bridge, {"carrier": "sip", "to": "+15005550123", "from": "+15005550006"})
                assert response.status_code == 202, response.text
                sip = listener(bridge)
                if sent:
                    await until(lambda: len(received) == 1)
                    assert received[0].startswith(b"INVITE sip:+15005550123@127.0.0.1:") and b"SIP/2.0/TLS" in received[0]
                    assert b";transport=tls>" in received[0]
                else:
                    await until(lambda: sip.dropped["tls_connect_failed"] == 1)
                    assert received == []
    finally:
        server.close()


def _server_context(pki: Pki) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.certificate, pki.private_key)
    return context


@pytest.mark.core
def test_a_certificate_gone_while_it_is_replaced_serves_on_and_its_successor_is_read(tmp_path: Path) -> None:
    """The files removed (a renewal writing them anew): the certificate in use serves on; once they are back, the
    next look reads them."""
    pki = issue(tmp_path)
    held = TlsCertificate(pki.certificate, pki.private_key)
    in_use = held.context
    pki.certificate.unlink()
    assert not held.refresh() and not held.refresh() and held.context is in_use
    issue(tmp_path)
    assert held.refresh() and held.context is not in_use and held.reloads == 1
    assert not held.refresh()  # unchanged since


async def test_handshakes_that_never_finish_are_closed_at_the_deadline_while_a_call_keeps_its_rtp(tmp_path: Path) -> None:
    """With a call up over TLS, 20 clients open the TLS port and stall their handshake (half send the first bytes of
    a ClientHello, half nothing): each is closed at ``sip.tls_handshake_timeout_s`` (the shipped 5 s) and counted,
    and the call's RTP goes on meanwhile (``bench/sip_tls_stall.py`` measures its largest gap)."""
    pki = issue(tmp_path)
    async with tls_bridge(pki) as bridge, trunk(bridge, pki.client()) as line:
        sip = listener(bridge)
        loop = asyncio.get_running_loop()
        rtp_port = free_port()
        transport, rtp = await loop.create_datagram_endpoint(RtpArrivals, local_addr=("127.0.0.1", rtp_port))
        try:
            call_id = "stall-" + secrets.token_hex(6)
            uri = f"sips:agent@127.0.0.1:{bridge.settings.sip.tls_port}"
            line.send("INVITE", uri, call_id, 1, body=offer(rtp_port))
            ok = await line.final()
            line.send("ACK", uri, call_id, 1, to_tag=ok.get("to").split("tag=")[1])
            await until(lambda: len(rtp.at) >= 5)
            started = time.monotonic()
            port = bridge.settings.sip.tls_port
            closed = await asyncio.gather(*(stalled_tls_handshake(port, TLS_HELLO_START if i % 2 else b"") for i in range(20)))
            deadline = bridge.settings.sip.tls_handshake_timeout_s
            assert all(deadline - 0.1 <= at - started <= deadline + 2.0 for at in closed), [round(at - started, 2) for at in closed]
            assert sip.dropped["tls_handshake_failed"] == 20 and sip.tls is not None and sip.tls.open == 1
            packets = sum(started <= at <= max(closed) for at in rtp.at)
            assert packets >= (max(closed) - started) * 50 * 0.9, packets  # 20 ms packets went on throughout
        finally:
            transport.close()
