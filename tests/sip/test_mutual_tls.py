"""SIP over TLS both ways with certificates on both sides (#43): a registration over TLS (REGISTER to a registrar that
asks for our certificate, our Contact the TLS port, the registrar's INVITE taken on the connection we opened, the
binding removed at shutdown), and mutual TLS on the TLS port (``sip.tls_client_ca_file``: a trunk without a
certificate from those CAs fails its handshake, one with it places its call).

The registrar is this test's, over a real TLS socket: SIPp, the project's SIP peer, has no TLS in Debian's build."""

from __future__ import annotations

import asyncio
import secrets
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trustme

from callbridge.carriers.sip.sim_wire import SipReply
from callbridge.carriers.sip.tls import TlsCertificate, ca_file_problems
from callbridge.config import Settings
from callbridge.sim.ports import free_port
from callbridge.sip.registration import RegistrationConfig, RegistrationState, SipRegistration
from tests.bridge.twilio_e2e import until
from tests.sip.test_sipp_e2e import listener
from tests.sip.test_tls import Pki, Trunk, issue, offer, tls_bridge, trunk

AOR = "sip:1001@127.0.0.1"


def _reply(request: SipReply, status: str, *extra: str) -> bytes:
    """The registrar's response to ``request``: its Via, From, To (tagged), Call-ID and CSeq, then ``extra``."""
    to = request.get("to")
    lines = [
        f"SIP/2.0 {status}", *(f"Via: {via}" for via in request.headers["via"]), f"From: {request.get('from')}",
        f"To: {to if 'tag=' in to else to + ';tag=registrar1'}", f"Call-ID: {request.get('call-id')}",
        f"CSeq: {request.get('cseq')}", *extra, "Content-Length: 0",
    ]  # fmt: skip
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Registrar:
    """A registrar on a TLS port that asks for the client's certificate (chained to ``client_ca``)."""

    def __init__(self, served: Pki, client_ca: trustme.CA) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(served.certificate, served.private_key)
        client_ca.configure_trust(self.context)
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.lines: asyncio.Queue[tuple[Trunk, dict[str, object] | None]] = asyncio.Queue()
        self.port = 0

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.lines.put((Trunk(reader, writer), writer.get_extra_info("peercert")))

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[Registrar]:
        server = await asyncio.start_server(self._accepted, "127.0.0.1", 0, ssl=self.context)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()


async def test_a_registration_over_tls_presents_our_certificate_binds_the_tls_port_and_takes_calls_on_its_connection(
    tmp_path: Path,
) -> None:
    """REGISTER over TLS to a registrar that asks for our certificate (``sip.tls_certificate``'s) and is trusted
    through ``tls_ca_file``: Via ``SIP/2.0/TLS``, our Contact the TLS port with ``;transport=tls``; the registrar's
    INVITE on that connection is answered there (200, ACK, BYE); the bridge's shutdown removes the binding
    (``Expires: 0``) on it too."""
    ours = issue(tmp_path)
    (tmp_path / "registrar").mkdir()
    registrar_pki = issue(tmp_path / "registrar")
    async with Registrar(registrar_pki, ours.ca).serving() as registrar:
        registration = {
            "registrar": f"sip:127.0.0.1:{registrar.port}", "aor": AOR, "transport": "tls",
            "tls_ca_file": str(registrar_pki.ca_file(tmp_path / "registrar")),
        }  # fmt: skip
        async with tls_bridge(ours, registrations=[registration]) as bridge:
            sip = listener(bridge)
            tls_port = bridge.settings.sip.tls_port
            line, peer_certificate = await asyncio.wait_for(registrar.lines.get(), 10)
            assert peer_certificate is not None, "the bridge presented no certificate"
            register = await line.read()
            assert register.method == "REGISTER" and register.get("via").startswith("SIP/2.0/TLS ")
            assert register.get("contact") == f"<sip:1001@127.0.0.1:{tls_port};transport=tls>"
            line.writer.write(_reply(register, "200 OK", f"Contact: {register.get('contact')};expires=3600"))
            await until(lambda: sip.registrations.clients[0].registered_count == 1)

            call_id = "reg-tls-" + secrets.token_hex(6)
            uri = f"sip:1001@127.0.0.1:{tls_port};transport=tls"
            line.send("INVITE", uri, call_id, 1, body=offer(free_port()))
            ok = await line.final()
            assert ok.status == 200 and ok.get("via").startswith("SIP/2.0/TLS "), ok
            to_tag = ok.get("to").split("tag=")[1]
            line.send("ACK", uri, call_id, 1, to_tag=to_tag)
            await until(lambda: call_id in sip.calls)
            line.send("BYE", uri, call_id, 2, to_tag=to_tag)
            assert (await line.final()).status == 200
            await until(lambda: len(sip.finished) == 1)
            stopping = asyncio.create_task(_answer_the_removal(line))
        removal = await asyncio.wait_for(stopping, 10)
        assert removal.get("expires") == "0" and removal.get("contact") == register.get("contact")
        assert not sip.dropped


async def _answer_the_removal(line: Trunk) -> SipReply:
    removal = await line.read()
    line.writer.write(_reply(removal, "200 OK"))
    await line.writer.drain()
    return removal


async def test_a_registrar_whose_certificate_is_not_trusted_gets_nothing_and_the_failure_is_counted(tmp_path: Path) -> None:
    """Without ``tls_ca_file`` the registrar's certificate (a test CA's) is not among the system's CAs: the handshake
    fails, counted (``tls_connect_failed``) and logged, and no REGISTER leaves."""
    ours = issue(tmp_path)
    (tmp_path / "registrar").mkdir()
    registrar_pki = issue(tmp_path / "registrar")
    async with Registrar(registrar_pki, ours.ca).serving() as registrar:
        registration = {"registrar": f"sip:127.0.0.1:{registrar.port}", "aor": AOR, "transport": "tls"}
        async with tls_bridge(ours, registrations=[registration]) as bridge:
            sip = listener(bridge)
            await until(lambda: sip.dropped["tls_connect_failed"] == 1)
            assert registrar.lines.empty() and sip.registrations.clients[0].registered_count == 0


async def test_with_mutual_tls_only_a_trunk_with_a_certificate_from_the_configured_cas_calls(tmp_path: Path) -> None:
    """``sip.tls_client_ca_file``: a trunk presenting no certificate, or one from another CA, fails its handshake
    (counted); one whose certificate chains to the configured CA places its call on the connection."""
    ours = issue(tmp_path)
    trunks_ca = trustme.CA()
    ca_file = tmp_path / "trunks-ca.pem"
    ca_file.write_bytes(trunks_ca.cert_pem.bytes())
    async with tls_bridge(ours, tls_client_ca_file=str(ca_file)) as bridge:
        sip = listener(bridge)
        without, from_another_ca = ours.client(), ours.client()
        trustme.CA().issue_cert("trunk.example.com").configure_cert(from_another_ca)
        await _refused(bridge.settings.sip.tls_port, without)
        await until(lambda: sip.dropped["tls_handshake_failed"] == 1)
        await _refused(bridge.settings.sip.tls_port, from_another_ca)
        await until(lambda: sip.dropped["tls_handshake_failed"] == 2)
        context = ours.client()
        trunks_ca.issue_cert("trunk.example.com").configure_cert(context)
        async with trunk(bridge, context) as line:
            call_id = "mtls-" + secrets.token_hex(6)
            uri = f"sips:agent@127.0.0.1:{bridge.settings.sip.tls_port}"
            line.send("INVITE", uri, call_id, 1, body=offer(free_port()))
            assert (await line.final()).status == 200
        assert sip.dropped["tls_handshake_failed"] == 2


async def _refused(port: int, context: ssl.SSLContext) -> None:
    """A client the server refuses: under TLS 1.3 its own handshake ends first, then the server's alert closes the
    connection at its first read."""
    with pytest.raises((ssl.SSLError, ConnectionError)):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="127.0.0.1")
        try:
            writer.write(b"OPTIONS sip:agent@127.0.0.1 SIP/2.0\r\n\r\n")
            if not await asyncio.wait_for(reader.read(1), 10):
                raise ConnectionResetError("closed")
        finally:
            writer.close()


@pytest.mark.core
def test_a_registration_over_tls_says_so_in_its_contact() -> None:
    config = RegistrationConfig(
        registrar="sip:pbx.example.com", aor=AOR, destination=("127.0.0.1", 5061), contact_host="192.0.2.7",
        contact_port=5061, transport="TLS",
    )  # fmt: skip
    core = SipRegistration(config)
    assert core.contact == "sip:1001@192.0.2.7:5061;transport=tls" and core.state is RegistrationState.IDLE
    core.start(0)
    (sent,) = core.datagrams_to_send()
    assert sent.transport == "TLS" and b"Via: SIP/2.0/TLS 192.0.2.7:5061;" in sent.data


@pytest.mark.core
def test_settings_refuse_tls_pieces_that_cannot_work_alone() -> None:
    registration = {"registrar": "sip:pbx.example.com", "aor": AOR, "transport": "tls"}
    with pytest.raises(ValueError, match=r"registrations.0.transport = tls needs tls_certificate"):
        Settings.model_validate({"sip": {"registrations": [registration]}})
    with pytest.raises(ValueError, match="tls_client_ca_file needs tls_certificate"):
        Settings.model_validate({"sip": {"tls_client_ca_file": "/ca.pem"}})


@pytest.mark.core
def test_a_ca_file_that_cannot_serve_is_named_in_one_line(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    assert ca_file_problems(tmp_path / "none.pem", now) == [f"{tmp_path / 'none.pem'} cannot be read: No such file or directory"]
    (tmp_path / "junk.pem").write_text("junk")
    assert ca_file_problems(tmp_path / "junk.pem", now) == [f"{tmp_path / 'junk.pem'} holds no PEM certificate"]
    good = tmp_path / "ca.pem"
    good.write_bytes(trustme.CA().cert_pem.bytes())
    assert ca_file_problems(good, now) == []
    (expired,) = ca_file_problems(good, now.replace(year=9000))  # trustme's CAs last until 3000
    assert expired.startswith(f"every certificate in {good} expired, the last on ")


@pytest.mark.core
def test_config_check_names_each_ca_file_that_cannot_serve(tmp_path: Path) -> None:
    pki = issue(tmp_path)
    sip = {
        "enabled": True, "tls_certificate": str(pki.certificate), "tls_private_key": str(pki.private_key),
        "tls_client_ca_file": str(tmp_path / "clients.pem"), "outbound": {"tls_ca_file": str(tmp_path / "trunk.pem")},
        "registrations": [{"registrar": "sip:pbx.example.com", "aor": AOR, "transport": "tls", "tls_ca_file": str(tmp_path / "pbx.pem")}],
    }  # fmt: skip
    problems = Settings.model_validate({"sip": sip}).sip.file_problems(datetime.now(UTC))
    assert [problem.split(":")[0] for problem in problems] == [
        "sip.tls_client_ca_file", "sip.outbound.tls_ca_file", "sip.registrations.0.tls_ca_file",
    ]  # fmt: skip


@pytest.mark.core
def test_a_client_ca_file_changed_is_read_again_with_the_certificate(tmp_path: Path) -> None:
    pki = issue(tmp_path)
    ca_file = tmp_path / "clients.pem"
    ca_file.write_bytes(trustme.CA().cert_pem.bytes())
    held = TlsCertificate(pki.certificate, pki.private_key, ca_file)
    assert held.context.verify_mode is ssl.CERT_REQUIRED and not held.refresh()
    ca_file.write_bytes(trustme.CA().cert_pem.bytes() + trustme.CA().cert_pem.bytes())
    assert held.refresh() and held.reloads == 1
