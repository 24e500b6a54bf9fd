"""RFC 3262 against real SIPp (Debian ``sip-tester``) on loopback: an INVITE with ``Require: 100rel`` (it got 420
before) is rung reliably, PRACKed, answered and hung up."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import engine, until
from tests.sip.test_sipp_e2e import listener, sip_settings, sipp

pytestmark = pytest.mark.skipif(shutil.which("sipp") is None, reason="SIPp (Debian package sip-tester) is not installed")


async def test_require_100rel_call_with_prack(tmp_path: Path) -> None:
    recorder = engine()
    async with running_bridge(sip_settings(answer_delay_ms=1000), recorder, provider="twilio") as bridge:
        rc, output = await sipp(bridge, "prack.xml", tmp_path, "-m", "1", timeout_s=20)
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
        call_id = sip.finished[0][0]
        dialog = sip.uas.dialogs[call_id]
    assert rc == 0, output
    assert dialog.rseq > 0 and dialog.unacked_rseq is None  # our 180 was reliable, and its PRACK matched
    assert len(recorder.opened) == 1
