"""Who may open the generic ``/media`` URL: each carrier checks its own proof (``Carrier.generic_upgrade``), and
``judge`` decides from what they say (the end-to-end cases are in tests/bridge/test_generic_media.py)."""

from __future__ import annotations

import base64

import pytest
from pydantic import SecretStr

from callbridge.carriers.generic.http import judge, upgrade_checks, websocket_carriers
from callbridge.carriers.spec import UpgradeProof
from callbridge.config import Settings

pytestmark = pytest.mark.core

URL = "wss://bridge.example/media"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def proofs(settings: Settings, headers: dict[str, str]) -> list[UpgradeProof]:
    checks = upgrade_checks(settings, websocket_carriers())
    return [proof for check in checks if (proof := check(URL, headers, "203.0.113.9")) is not None]


def test_no_proof_needs_the_token_and_a_right_one_keeps_needing_it_unless_it_is_the_carriers_own_admission() -> None:
    assert judge([], requires_token=True) == (None, True)
    assert judge([UpgradeProof()], requires_token=True) == (None, True)
    assert judge([UpgradeProof(token_needed=False)], requires_token=True) == (None, False)
    assert judge([], requires_token=False) == (None, False)


def test_a_wrong_proof_refuses_unless_another_is_right() -> None:
    assert judge([UpgradeProof("bad_signature")], requires_token=True)[0] == "bad_signature"
    assert judge([UpgradeProof("bad_credentials"), UpgradeProof()], requires_token=True) == (None, True)


def test_one_basic_header_read_by_two_carriers_admits_by_whichever_it_belongs_to() -> None:
    settings = Settings.model_validate({
        "exotel": {"api_key": "ex-key", "api_token": SecretStr("ex-token")},
        "jambonz": {"ws_username": "jb", "ws_password": SecretStr("jb-pass")},
    })  # fmt: skip
    assert judge(proofs(settings, {"authorization": basic("ex-key", "ex-token")}), requires_token=True) == (None, False)
    assert judge(proofs(settings, {"authorization": basic("jb", "jb-pass")}), requires_token=True) == (None, True)
    assert judge(proofs(settings, {"authorization": basic("jb", "wrong")}), requires_token=True)[0] == "bad_credentials"


def test_a_signature_header_must_be_right_for_the_url() -> None:
    settings = Settings.model_validate({"twilio": {"auth_token": SecretStr("t" * 32)}})
    refusal, _ = judge(proofs(settings, {"x-twilio-signature": "bm90IGl0"}), requires_token=True)
    assert refusal == "bad_signature"
