"""jambonz's REST API, for the calls the agent places (#42): create a call whose ``call_hook`` is our calling webhook
(naming the dial) and whose ``call_status_hook`` is our call-status webhook, and end it (``call_status``
``no-answer`` while it rings, ``completed`` once answered). Bearer API key; the account's SID in the path."""

from __future__ import annotations

from typing import Final
from urllib.parse import quote

import httpx

from callbridge.bridge.dialer import DialLeg, DialProgress, DialRejected
from callbridge.carriers.jambonz.settings import JambonzSettings
from callbridge.config import Settings
from callbridge.outbound_http import http_client, response_object

__all__ = ["JambonzRest", "jambonz_rest", "placed_call_progress"]

ANSWER_PATH: Final = "/jambonz/call"
STATUS_PATH: Final = "/jambonz/status"
_STATUS_PROGRESS: Final[dict[str, DialProgress]] = {
    "ringing": "ringing", "early-media": "ringing", "in-progress": "answered", "completed": "completed", "busy": "busy",
    "no-answer": "no_answer", "failed": "failed",
}  # fmt: skip


def placed_call_progress(call_status: str, sip_status: object) -> DialProgress | None:
    """A placed call's call-status webhook, as the dialer follows it (``trying``: None, nothing to tell); a
    ``failed`` call's SIP status tells a decline (603) or busy (486, 600) apart."""
    progress = _STATUS_PROGRESS.get(call_status)
    if progress == "failed" and sip_status in (486, 600):
        return "busy"
    if progress == "failed" and sip_status == 603:
        return "declined"
    return progress


class JambonzRest:
    """jambonz's REST calls (see the module docstring)."""

    def __init__(self, config: JambonzSettings, *, client: httpx.AsyncClient | None = None) -> None:
        self._base = config.api_base_url.rstrip("/")
        self._account = config.account_sid
        self._key = config.api_key.get_secret_value() if config.api_key is not None else None
        self._client = client or http_client(timeout=10.0)

    @property
    def can_dial(self) -> bool:
        return self._account is not None and self._key is not None

    def _calls_url(self, call_id: str | None = None) -> str:
        assert self._account is not None
        url = f"{self._base}/v1/Accounts/{quote(self._account, safe='')}/Calls"
        return url if call_id is None else f"{url}/{quote(call_id, safe='')}"

    async def dial(self, leg: DialLeg) -> str:
        """``POST …/Accounts/{account}/Calls``: jambonz rings ``leg.to`` for the ring timeout, POSTs the call hook
        (naming the dial) when it is answered, and the call's status changes to the status hook. Its ``sid``;
        raises ``DialRejected`` with jambonz's message."""
        if not self.can_dial:
            raise DialRejected("not_configured", "dialling needs jambonz.account_sid and jambonz.api_key")
        body = {
            "from": leg.from_, "to": {"type": "phone", "number": leg.to}, "timeout": leg.ring_timeout_s,
            "call_hook": {"url": f"{leg.base_url}{ANSWER_PATH}?dial={leg.dial_id}", "method": "POST"},
            "call_status_hook": {"url": f"{leg.base_url}{STATUS_PATH}", "method": "POST"},
            "tag": {"dial_id": leg.dial_id},
        }  # fmt: skip
        try:
            response = await self._client.post(self._calls_url(), json=body, headers={"Authorization": f"Bearer {self._key}"})
        except httpx.HTTPError as exc:
            raise DialRejected("unreachable", repr(exc)) from exc
        answer = response_object(response)
        sid = answer.get("sid")
        if response.status_code != 201 or not isinstance(sid, str) or not sid:
            message = answer.get("msg") or answer.get("message")
            raise DialRejected("refused", f"HTTP {response.status_code} {message or response.text[:200]}".strip())
        return sid

    async def _update(self, call_id: str, call_status: str) -> bool:
        response = await self._client.put(self._calls_url(call_id), json={"call_status": call_status}, headers={"Authorization": f"Bearer {self._key}"})
        if response.status_code == 404:
            return False
        response.raise_for_status()
        return True

    async def prepare(self) -> None:
        """Nothing to get ready: every dial is one request with the credentials as they are."""

    async def cancel(self, call_id: str) -> bool:
        """Stop a placed call that rings (``call_status`` ``no-answer``); False where it is not ringing any more or the
        request was not taken."""
        if not self.can_dial:
            return False
        try:
            return await self._update(call_id, "no-answer")
        except httpx.HTTPError:
            return False

    async def hang_up(self, call_id: str, account_id: str | None) -> None:
        """End the call (``call_status`` ``completed``); one already over (404) counts as done."""
        if not self.can_dial:
            raise RuntimeError("a REST hang-up needs jambonz.account_sid and jambonz.api_key")
        await self._update(call_id, "completed")

    async def aclose(self) -> None:
        await self._client.aclose()


def jambonz_rest(settings: Settings) -> JambonzRest:
    return JambonzRest(settings.jambonz)
