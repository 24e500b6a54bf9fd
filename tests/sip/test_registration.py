"""The REGISTER client core (RFC 3261 §10) under a hand-moved clock: a registrar in memory answers its requests."""

from __future__ import annotations

import hashlib

import pytest

from callbridge.sip.digest import (
    DigestChallenge,
    authorization,
    best_challenge,
    parse_challenge,
)
from callbridge.sip.message import (
    SipRequest,
    SipResponse,
    header_param,
    parse_message,
    split_params,
)
from callbridge.sip.registration import (
    Registered,
    RegistrationConfig,
    RegistrationFailed,
    RegistrationState,
    RegistrationStateError,
    SipRegistration,
    Unregistered,
    refresh_delay_ms,
)
from callbridge.sip.transaction import T1_MS, T2_MS, TIMEOUT_MS

REGISTRAR = ("192.0.2.10", 5060)
PASSWORD = "s3cret"


def registration(**overrides: object) -> SipRegistration:
    config = {
        "registrar": "sip:pbx.example.com",
        "aor": "sip:1001@pbx.example.com",
        "destination": REGISTRAR,
        "contact_host": "198.51.100.7",
        "contact_port": 5070,
        "password": PASSWORD,
        "expires_s": 600,
    } | overrides
    return SipRegistration(RegistrationConfig(**config), rand=lambda: 1.0)  # type: ignore[arg-type]


def sent(reg: SipRegistration) -> SipRequest:
    (out,) = reg.datagrams_to_send()
    assert out.address == REGISTRAR
    request = parse_message(out.data)
    assert isinstance(request, SipRequest)
    return request


def answer(request: SipRequest, status: int, *headers: tuple[str, str]) -> SipResponse:
    response = SipResponse(status=status, reason="X")
    for name in ("Via", "From", "To", "Call-ID", "CSeq"):
        response.add(name, request.header(name) or "")
    for name, value in headers:
        response.add(name, value)
    return response


def challenge(nonce: str, algorithm: str = "MD5") -> tuple[str, str]:
    return ("WWW-Authenticate", f'Digest realm="pbx", nonce="{nonce}", algorithm={algorithm}, qop="auth"')


def digest_valid(request: SipRequest, header: str = "Authorization") -> bool:
    """The registrar's check (RFC 2617 §3.2.2.1), written apart from the client's code."""
    value = request.header(header)
    assert value is not None and value.startswith("Digest ")
    params = {k.strip(): v.strip().strip('"') for k, _, v in (p.partition("=") for p in value[7:].split(","))}
    algo = {"MD5": hashlib.md5, "SHA-256": hashlib.sha256}[params["algorithm"]]

    def h(text: str) -> str:
        return algo(text.encode()).hexdigest()

    ha1 = h(f"{params['username']}:{params['realm']}:{PASSWORD}")
    ha2 = h(f"REGISTER:{params['uri']}")
    expected = h(f"{ha1}:{params['nonce']}:{params['nc']}:{params['cnonce']}:auth:{ha2}")
    return params["response"] == expected and params["uri"] == request.uri


def register(reg: SipRegistration, now_ms: int = 0, expires: int = 600) -> SipRequest:
    """Start and complete the first REGISTER (one challenge)."""
    reg.start(now_ms)
    first = sent(reg)
    reg.receive_response(answer(first, 401, challenge("n1")), now_ms)
    second = sent(reg)
    reg.receive_response(answer(second, 200, ("Contact", f"<{reg.contact}>;expires={expires}")), now_ms)
    return second


class TestRequest:
    """§10.2: what a REGISTER carries."""

    def test_first_register(self) -> None:
        reg = registration(outbound_proxy="sip:proxy.example.com:5080")
        reg.start(0)
        request = sent(reg)
        assert request.method == "REGISTER" and request.uri == "sip:pbx.example.com"
        assert request.header("To") == "<sip:1001@pbx.example.com>"
        assert (request.header("From") or "").startswith("<sip:1001@pbx.example.com>;tag=")
        assert request.header("Contact") == "<sip:1001@198.51.100.7:5070>"
        assert request.header("Expires") == "600" and request.cseq == (1, "REGISTER")
        assert request.header("Route") == "<sip:proxy.example.com:5080;lr>"
        assert request.header("Authorization") is None
        assert request.branch.startswith("z9hG4bK") and "rport" in request.top_via
        assert reg.state is RegistrationState.REGISTERING

    def test_request_uri_has_no_user_part(self) -> None:
        reg = registration(registrar="sip:someone@pbx.example.com:5062")
        reg.start(0)
        assert sent(reg).uri == "sip:pbx.example.com:5062"

    def test_call_id_and_from_tag_kept_cseq_grows_across_challenge_and_refresh(self) -> None:
        reg = registration()
        reg.start(0)
        first = sent(reg)
        reg.receive_response(answer(first, 401, challenge("n1")), 10)
        second = sent(reg)
        reg.receive_response(answer(second, 200, ("Expires", "600")), 20)
        reg.tick(refresh_delay_ms(600) + 20)
        third = sent(reg)
        assert first.call_id == second.call_id == third.call_id
        from_tags = {header_param(r.header("From") or "", "tag") for r in (first, second, third)}
        assert len(from_tags) == 1
        assert [r.cseq[0] for r in (first, second, third)] == [1, 2, 3]
        assert len({r.branch for r in (first, second, third)}) == 3

    def test_start_twice_is_a_local_error(self) -> None:
        reg = registration()
        reg.start(0)
        with pytest.raises(RegistrationStateError) as caught:
            reg.start(1)
        assert caught.value.state is RegistrationState.REGISTERING


class TestChallenge:
    """§22.2 with RFC 2617 / RFC 8760: 401 and 407 answered once per nonce."""

    def test_401_answered_with_valid_credentials(self) -> None:
        reg = registration()
        second = register(reg)
        assert digest_valid(second)
        assert split_params("x;" + (second.header("Authorization") or "").replace(", ", ";"))[1]["nc"] == "00000001"
        assert reg.state is RegistrationState.REGISTERED
        assert reg.events() == [Registered("sip:1001@pbx.example.com", 600, refresh_delay_ms(600))]

    def test_auth_user_differs_from_the_aor_user(self) -> None:
        reg = registration(auth_user="trunk-7")
        second = register(reg)
        assert 'username="trunk-7"' in (second.header("Authorization") or "") and digest_valid(second)

    def test_407_answered_in_proxy_authorization(self) -> None:
        reg = registration()
        reg.start(0)
        first = sent(reg)
        proxy_challenge = ("Proxy-Authenticate", 'Digest realm="proxy", nonce="p1", qop="auth"')
        reg.receive_response(answer(first, 407, proxy_challenge), 0)
        second = sent(reg)
        assert second.header("Authorization") is None and digest_valid(second, "Proxy-Authorization")

    def test_the_strongest_challenge_is_answered(self) -> None:
        reg = registration()
        reg.start(0)
        first = sent(reg)
        reg.receive_response(answer(first, 401, challenge("m", "MD5"), challenge("s", "SHA-256")), 0)
        second = sent(reg)
        assert "algorithm=SHA-256" in (second.header("Authorization") or "") and digest_valid(second)

    def test_same_nonce_twice_means_wrong_credentials(self) -> None:
        reg = registration()
        reg.start(0)
        first = sent(reg)
        reg.receive_response(answer(first, 401, challenge("n1")), 0)
        second = sent(reg)
        reg.receive_response(answer(second, 401, challenge("n1")), 5)
        assert reg.datagrams_to_send() == []
        (failed,) = reg.events()
        assert isinstance(failed, RegistrationFailed) and failed.reason == "auth_rejected" and failed.status == 401
        assert reg.state is RegistrationState.RETRY_WAIT

    def test_a_new_nonce_on_refresh_is_answered_again(self) -> None:
        reg = registration()
        register(reg)
        reg.tick(refresh_delay_ms(600))
        refresh = sent(reg)
        assert 'nonce="n1"' in (refresh.header("Authorization") or "") and "nc=00000002" in (refresh.header("Authorization") or "")
        reg.receive_response(answer(refresh, 401, challenge("n2")), refresh_delay_ms(600))
        again = sent(reg)
        assert 'nonce="n2"' in (again.header("Authorization") or "") and digest_valid(again)

    def test_no_password_cannot_answer(self) -> None:
        reg = registration(password=None)
        reg.start(0)
        reg.receive_response(answer(sent(reg), 401, challenge("n1")), 0)
        (failed,) = reg.events()
        assert isinstance(failed, RegistrationFailed) and failed.reason == "no_credentials"

    def test_digest_helpers(self) -> None:
        parsed = parse_challenge('Digest realm="a, b", nonce="x", opaque="o", algorithm=MD5-sess, qop="auth,auth-int", stale=TRUE')
        assert parsed == DigestChallenge("a, b", "x", "MD5-sess", "o", ("auth", "auth-int"), True)
        assert parse_challenge('Basic realm="x"') is None
        assert best_challenge(['Digest realm="r", nonce="n", qop="auth-int"']) is None
        text = authorization(parsed, method="REGISTER", uri="sip:x", username="u", password="p", cnonce="c", nonce_count=1)
        assert 'opaque="o"' in text and "algorithm=MD5-sess" in text


class TestIntervalTooBrief:
    """§10.2.8: 423 → again with the registrar's Min-Expires."""

    def test_423_raises_expires(self) -> None:
        reg = registration(expires_s=60)
        reg.start(0)
        reg.receive_response(answer(sent(reg), 423, ("Min-Expires", "300")), 0)
        again = sent(reg)
        assert again.header("Expires") == "300" and again.cseq[0] == 2
        reg.receive_response(answer(again, 200), 0)  # no Contact, no Expires: what we asked
        assert reg.granted_expires_s == 300 and reg.expires_s == 300

    def test_423_without_a_larger_minimum_fails(self) -> None:
        reg = registration(expires_s=600)
        reg.start(0)
        reg.receive_response(answer(sent(reg), 423, ("Min-Expires", "300")), 0)
        (failed,) = reg.events()
        assert isinstance(failed, RegistrationFailed) and failed.reason == "interval_too_brief"


class TestRefresh:
    """§10.2.4: the granted expiry is the Contact's, else Expires; refreshed before it ends."""

    def test_refresh_delay(self) -> None:
        assert refresh_delay_ms(3600) == 3600_000 - TIMEOUT_MS  # long: late, leaving room for a whole timeout
        assert refresh_delay_ms(60) == 30_000  # half (30 s) is later than 60 − 32 s
        assert refresh_delay_ms(4) == 2_000  # short: halfway

    def test_contact_expires_wins_over_expires_header(self) -> None:
        reg = registration()
        reg.start(0)
        request = sent(reg)
        other = "<sip:1001@203.0.113.9:5060>;expires=3600"
        reg.receive_response(answer(request, 200, ("Contact", f"{other}, <{reg.contact};transport=udp>;expires=120"), ("Expires", "900")), 0)
        assert reg.granted_expires_s == 120
        assert reg.next_deadline_ms() == refresh_delay_ms(120)

    def test_refresh_is_sent_when_due_not_before(self) -> None:
        reg = registration()
        register(reg, 1000, expires=120)
        reg.events()
        due = 1000 + refresh_delay_ms(120)
        reg.tick(due - 1)
        assert reg.datagrams_to_send() == []
        reg.tick(due)
        refresh = sent(reg)
        assert refresh.header("Expires") == "600" and reg.state is RegistrationState.REGISTERING
        reg.receive_response(answer(refresh, 200, ("Expires", "120")), due + 50)
        assert reg.events() == [Registered("sip:1001@pbx.example.com", 120, refresh_delay_ms(120))]
        assert reg.next_deadline_ms() == due + 50 + refresh_delay_ms(120)

    def test_retransmitted_over_udp_until_answered(self) -> None:
        reg = registration()
        reg.start(0)
        first = sent(reg)
        times: list[int] = []
        now = 0
        while len(times) < 5:
            now = reg.next_deadline_ms() or 0
            reg.tick(now)
            out = reg.datagrams_to_send()
            assert [o.data for o in out] == [first.serialize()]
            times.append(now)
        assert times == [T1_MS, 3 * T1_MS, 7 * T1_MS, 7 * T1_MS + T2_MS, 7 * T1_MS + 2 * T2_MS]  # Timer E, capped at T2
        reg.receive_response(answer(first, 100), now)
        assert reg.next_deadline_ms() == now + T2_MS
        reg.receive_response(answer(first, 200), now + 1)
        assert reg.state is RegistrationState.REGISTERED

    def test_responses_of_others_are_not_taken(self) -> None:
        reg = registration()
        reg.start(0)
        request = sent(reg)
        stranger = answer(request, 200)
        stranger.set("Call-ID", "someone-else")
        assert not reg.receive_response(stranger, 0)
        stale = answer(request, 200)
        stale.set("CSeq", "0 REGISTER")
        assert reg.receive_response(stale, 0) and reg.state is RegistrationState.REGISTERING


class TestBackoff:
    """RFC 5626 §4.5: 30 s, doubling, capped, 50–100 % of it; Retry-After when the registrar gives one."""

    def test_failures_back_off_then_success_resets(self) -> None:
        reg = registration(retry_base_ms=30_000, retry_max_ms=100_000)
        reg.start(0)
        now = 0
        delays: list[int] = []
        for _ in range(4):
            reg.receive_response(answer(sent(reg), 403), now)
            (failed,) = reg.events()
            assert isinstance(failed, RegistrationFailed) and failed.reason == "rejected" and failed.status == 403
            delays.append(failed.retry_in_ms)
            assert reg.state is RegistrationState.RETRY_WAIT and reg.next_deadline_ms() == now + failed.retry_in_ms
            reg.tick(now + failed.retry_in_ms - 1)
            assert reg.datagrams_to_send() == []
            now += failed.retry_in_ms
            reg.tick(now)
        assert delays == [30_000, 60_000, 100_000, 100_000]
        reg.receive_response(answer(sent(reg), 200), now)
        assert reg.failures == 0 and reg.state is RegistrationState.REGISTERED

    def test_randomised_between_half_and_all(self) -> None:
        reg = SipRegistration(
            RegistrationConfig("sip:pbx", "sip:a@pbx", REGISTRAR, "127.0.0.1", 5060, retry_base_ms=30_000), rand=lambda: 0.0
        )
        reg.start(0)
        reg.receive_response(answer(sent(reg), 500), 0)
        assert reg.events() == [RegistrationFailed("sip:a@pbx", 500, "rejected", 15_000)]

    def test_retry_after(self) -> None:
        reg = registration()
        reg.start(0)
        reg.receive_response(answer(sent(reg), 503, ("Retry-After", "120 (maintenance);duration=60")), 0)
        assert reg.events() == [RegistrationFailed("sip:1001@pbx.example.com", 503, "rejected", 120_000)]

    def test_no_answer_times_out(self) -> None:
        reg = registration()
        reg.start(0)
        sent(reg)
        now = 0
        while reg.state is RegistrationState.REGISTERING:
            now = reg.next_deadline_ms() or 0
            reg.tick(now)
            reg.datagrams_to_send()
        assert now == TIMEOUT_MS
        assert reg.events() == [RegistrationFailed("sip:1001@pbx.example.com", 408, "timeout", 30_000)]


class TestUnregister:
    """§10.2.2: Expires: 0 for our contact at stop."""

    def test_unregister_after_registered(self) -> None:
        reg = registration()
        register(reg)
        reg.events()
        reg.stop(5000)
        request = sent(reg)
        assert request.header("Expires") == "0" and request.header("Contact") == f"<{reg.contact}>"
        assert digest_valid(request) and reg.state.value == "unregistering"
        assert reg.next_deadline_ms() == 5000 + T1_MS  # the refresh is cancelled
        reg.receive_response(answer(request, 200), 5100)
        assert reg.events() == [Unregistered("sip:1001@pbx.example.com", 200)]
        assert reg.state.value == "stopped" and reg.next_deadline_ms() is None
        reg.stop(6000)  # again: nothing
        assert reg.datagrams_to_send() == []

    def test_unregister_challenged_is_answered(self) -> None:
        reg = registration()
        register(reg)
        reg.stop(0)
        request = sent(reg)
        reg.receive_response(answer(request, 401, challenge("n9")), 0)
        again = sent(reg)
        assert again.header("Expires") == "0" and 'nonce="n9"' in (again.header("Authorization") or "")
        reg.receive_response(answer(again, 200), 0)
        assert reg.state is RegistrationState.STOPPED

    def test_nothing_to_remove_before_any_register(self) -> None:
        reg = registration()
        reg.stop(0)
        assert reg.datagrams_to_send() == [] and reg.events() == [Unregistered("sip:1001@pbx.example.com", 0)]
        assert reg.state is RegistrationState.STOPPED

    def test_nothing_to_remove_after_a_refusal(self) -> None:
        reg = registration()
        reg.start(0)
        reg.receive_response(answer(sent(reg), 403), 0)
        reg.events()
        reg.stop(10)
        assert reg.datagrams_to_send() == [] and reg.events() == [Unregistered("sip:1001@pbx.example.com", 0)]

    def test_unanswered_unregister_ends_at_the_timeout(self) -> None:
        reg = registration()
        register(reg)
        reg.events()
        reg.stop(0)
        sent(reg)
        now = 0
        while reg.state is RegistrationState.UNREGISTERING:
            now = reg.next_deadline_ms() or 0
            reg.tick(now)
            reg.datagrams_to_send()
        assert reg.events() == [Unregistered("sip:1001@pbx.example.com", 408)]

    def test_stop_while_registering_waits_for_the_register_in_flight(self) -> None:
        """§10.2: no new REGISTER before the previous one's final response (or timeout)."""
        reg = registration()
        reg.start(0)
        first = sent(reg)
        reg.stop(10)
        assert reg.datagrams_to_send() == [] and reg.state is RegistrationState.UNREGISTERING
        reg.receive_response(answer(first, 401, challenge("n1")), 20)
        removal = sent(reg)
        assert removal.header("Expires") == "0" and removal.cseq[0] == 2 and digest_valid(removal)
        assert reg.events() == []
        reg.receive_response(answer(removal, 200), 30)
        assert reg.events() == [Unregistered("sip:1001@pbx.example.com", 200)]

    def test_stop_during_an_unanswered_refresh_removes_after_its_timeout(self) -> None:
        reg = registration()
        register(reg)
        reg.events()
        refreshed_at = now = refresh_delay_ms(600)
        reg.tick(now)
        assert sent(reg).header("Expires") == "600"
        reg.stop(now)
        removal: SipRequest | None = None
        while removal is None:
            now = reg.next_deadline_ms() or 0
            reg.tick(now)
            for out in reg.datagrams_to_send():
                request = parse_message(out.data)
                assert isinstance(request, SipRequest)
                if request.header("Expires") == "0":
                    removal = request
        assert now == refreshed_at + TIMEOUT_MS and removal.cseq[0] == 4
        assert reg.events() == []  # the refresh's timeout is no failure: the removal took its place


class TestSettings:
    """``sip.registrations``: URIs checked at load, the target address read from them."""

    def test_targets(self) -> None:
        from callbridge.carriers.sip.registrar import sip_target

        assert sip_target("sip:pbx.example.com") == ("pbx.example.com", 5060)
        assert sip_target("sip:1001@10.0.0.5:5080;transport=udp") == ("10.0.0.5", 5080)
        assert sip_target("<sip:[2001:db8::1]:5062>") == ("2001:db8::1", 5062)

    def test_uris_are_validated(self) -> None:
        from pydantic import ValidationError

        from callbridge.carriers.sip.settings import SipRegistrationSettings

        good = SipRegistrationSettings(registrar="sip:pbx", aor="sip:1001@pbx", password="x")  # type: ignore[arg-type]
        assert good.transport == "udp" and good.expires_s == 3600
        for bad in ({"registrar": "pbx"}, {"aor": "sip:pbx"}, {"outbound_proxy": "http://x"}, {"transport": "sctp"}):
            with pytest.raises(ValidationError):
                SipRegistrationSettings(**({"registrar": "sip:pbx", "aor": "sip:1001@pbx"} | bad))  # type: ignore[arg-type]

    def test_a_wildcard_listener_registers_the_address_routed_to_the_registrar(self) -> None:
        from prometheus_client import CollectorRegistry

        from callbridge.bridge.metrics import BridgeMetrics
        from callbridge.carriers.sip.registrar import RegistrationClients

        clients = RegistrationClients([], BridgeMetrics(CollectorRegistry()), lambda out: None, lambda: False)
        clients.start("0.0.0.0", 5070)
        assert clients.contact_for(("127.0.0.1", 5060)) == ("127.0.0.1", 5070)
        clients.start("192.0.2.1", 5070)
        assert clients.contact_for(("127.0.0.1", 5060)) == ("192.0.2.1", 5070)
