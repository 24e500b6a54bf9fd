"""The REGISTER client end to end with real SIPp (Debian ``sip-tester``) as the registrar on loopback:
``scenarios/registrar.xml`` challenges the first REGISTER, verifies the digest answer, grants 2 s, verifies each
refresh, and ends on the ``Expires: 0`` the bridge sends as it shuts down."""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path

import pytest

from callbridge.sim.ports import free_port
from callbridge.sim.runner import running_bridge
from callbridge.sip.registration import RegistrationState
from tests.bridge.twilio_e2e import engine, until
from tests.sip.test_sipp_e2e import SCENARIOS, listener, sip_settings

pytestmark = pytest.mark.skipif(shutil.which("sipp") is None, reason="SIPp (Debian package sip-tester) is not installed")

AOR = "sip:1001@127.0.0.1"


async def registrar(workdir: Path, port: int, timeout_s: int = 30, transport: str = "udp") -> asyncio.subprocess.Process:
    """SIPp serving ``registrar.xml`` on ``port`` for one registration (its exit status: 0 when it completed)."""
    args = [
        "-t", "t1" if transport == "tcp" else "u1",
        "-sf", str(SCENARIOS / "registrar.xml"), "-i", "127.0.0.1", "-p", str(port), "-mp", str(free_port()),
        "-m", "1", "-nostdin", "-timeout", f"{timeout_s}s", "-timeout_error", "-trace_err",
    ]  # fmt: skip
    return await asyncio.create_subprocess_exec(
        "sipp", *args, cwd=workdir, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


async def finished(proc: asyncio.subprocess.Process, workdir: Path) -> tuple[int, str]:
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 40)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    errors = "".join(p.read_text(errors="replace") for p in workdir.glob("*_errors.log"))
    return proc.returncode or 0, out.decode(errors="replace")[-3000:] + errors[-3000:]


@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_register_challenge_refresh_and_unregister_with_sipp(tmp_path: Path, transport: str) -> None:
    port = free_port()
    proc = await registrar(tmp_path, port, transport=transport)
    if transport == "tcp":
        await until(lambda: listening(port), timeout_s=5)  # over UDP the REGISTER is retransmitted until it is up
    registration = {"registrar": f"sip:127.0.0.1:{port}", "aor": AOR, "password": "s3cret", "expires_s": 2, "transport": transport}
    try:
        async with running_bridge(sip_settings(registrations=[registration]), engine(), provider="twilio") as bridge:
            sip = listener(bridge)
            (client,) = sip.registrations.clients
            metrics = bridge.app.state.bridge.registry
            await until(lambda: client.registered_count >= 2, timeout_s=10)  # the first binding and a refresh
            assert metrics.get_sample_value("callbridge_sip_registration_state", {"registration": AOR, "state": "registered"}) == 1
            core = client.core
            assert core is not None and core.granted_expires_s == 2
            suffix = ";transport=tcp" if transport == "tcp" else ""
            assert core.contact == f"sip:1001@127.0.0.1:{bridge.settings.sip.port}{suffix}"  # the listener's own address
        rc, output = await finished(proc, tmp_path)  # leaving the bridge sent Expires: 0; SIPp ends on its 200
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert rc == 0, output
    assert core.state is RegistrationState.STOPPED and client.failures == []
    assert core.cseq >= 4  # challenged REGISTER, authorized one, a refresh, the removal (one Call-ID throughout)
    assert metrics.get_sample_value("callbridge_sip_registration_state", {"registration": AOR, "state": "stopped"}) == 1


async def test_wrong_password_is_counted_and_retried_later(tmp_path: Path) -> None:
    port = free_port()
    proc = await registrar(tmp_path, port, timeout_s=10)
    registration = {"registrar": f"sip:127.0.0.1:{port}", "aor": AOR, "password": "wrong", "retry_base_s": 60.0}
    try:
        async with running_bridge(sip_settings(registrations=[registration]), engine(), provider="twilio") as bridge:
            (client,) = listener(bridge).registrations.clients
            metrics = bridge.app.state.bridge.registry
            await until(lambda: bool(client.failures), timeout_s=10)
            (failed,) = client.failures
            assert failed.status == 403 and failed.reason == "rejected" and 30_000 <= failed.retry_in_ms <= 60_000
            labels = {"registration": AOR, "reason": "rejected"}
            assert metrics.get_sample_value("callbridge_sip_registration_failures_total", labels) == 1
            assert metrics.get_sample_value("callbridge_sip_registration_state", {"registration": AOR, "state": "retry_wait"}) == 1
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_drain_removes_the_binding_while_the_bridge_runs(tmp_path: Path) -> None:
    """SIGTERM's drain un-REGISTERs at once, so that the PBX sends its next calls elsewhere."""
    port = free_port()
    proc = await registrar(tmp_path, port)
    registration = {"registrar": f"sip:127.0.0.1:{port}", "aor": AOR, "password": "s3cret", "expires_s": 60}
    try:
        async with running_bridge(sip_settings(registrations=[registration]), engine(), provider="twilio") as bridge:
            (client,) = listener(bridge).registrations.clients
            await until(lambda: client.registered_count == 1, timeout_s=10)
            await bridge.app.state.bridge.services.drain(1.0)
            rc, output = await finished(proc, tmp_path)  # SIPp ends on the Expires: 0 it answered
            assert client.core is not None and client.core.state is RegistrationState.STOPPED and client.failures == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert rc == 0, output
