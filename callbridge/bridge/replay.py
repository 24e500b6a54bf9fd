"""A signed webhook is taken once (issue #15): a replay of one already taken is refused 403, on every process of the
fleet (the proofs are kept in the call registry: Redis for a fleet).

A carrier's signature proves who sent a request, not that it is new: anyone who saw one (a log, a proxy, a
leaked capture) could send it again, and a replayed answer webhook mints a fresh stream token for a live call,
which lets a stranger's socket take that call's engine session over. So once a request's signature has been
checked, what proves it (the signature, a nonce, a JWT's ``jti``) is remembered for as long as the carrier's
signature would stay valid (``ReplayGuard.first_sight``'s ``valid_s``: a signed timestamp taken 5 minutes either
side, a JWT's ``iat`` 5 minutes back); signatures that carry no time are kept as long as a call
may last (``server.max_call_duration_s``; with no limit, ``REPLAY_WINDOW_S``): no replay reaches a live call.

Only signed requests are remembered (an unsigned one is refused before), so what is kept is the carriers' own
traffic. A carrier's retry of a request whose answer it did not get is the same request: if the bridge answered
it with an error (5xx, or the handler raised), the proof is forgotten (``ReplayRelease``), so the retry is taken;
if it answered it, the retry is a replay. Media upgrades are not remembered: a carrier that signs them signs every upgrade of a
number alike (its URL, no parameters), and what admits a stream is its single-use token.

The registry unreachable, the request is taken unchecked (logged, counted): refusing every webhook while Redis
is away would end calls that replays never threatened.
"""

from __future__ import annotations

import hashlib
from typing import Final

from prometheus_client import Counter
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from callbridge.bridge.registry import CallRegistry, RegistryUnavailable
from callbridge.logging import get_logger

__all__ = ["REPLAY_WINDOW_S", "ReplayGuard", "ReplayRelease"]

log = get_logger(__name__)

REPLAY_WINDOW_S: Final = 4 * 3600.0
"""How long a proof with no time in it (a signature over the URL and parameters alone) is remembered when calls have no
``server.max_call_duration_s`` (the default limit is four hours too)."""

_SCOPE_KEY: Final = "callbridge.replay_keys"
"""Where a request's remembered keys wait in its ASGI scope, for ``ReplayRelease`` to forget on a failure."""


class ReplayGuard:
    """Which signed requests were taken already, by their proof, in the shared registry."""

    def __init__(self, registry: CallRegistry, checks: Counter, timeless_keep_s: float) -> None:
        self._registry = registry
        self._checks = checks
        """``callbridge_webhook_replay_checks_total{provider,result}``: first, replayed, unchecked."""
        self.timeless_keep_s = timeless_keep_s
        """How long a proof with no time in it is kept."""

    async def first_sight(self, request: Request, provider: str, proof: str, keep_s: float | None = None) -> bool:
        """True the first time a request with ``proof`` is seen within ``keep_s`` (None: ``timeless_keep_s``;
        then a failed answer to it forgets it); False for a replay, logged."""
        keep_s = self.timeless_keep_s if keep_s is None else keep_s
        key = f"{provider}:{hashlib.sha256(proof.encode()).hexdigest()[:40]}"
        try:
            first = await self._registry.remember_once(key, max(1, round(keep_s * 1000)))
        except RegistryUnavailable as exc:
            log.warning("replay_check_unavailable", provider=provider, path=request.url.path, detail=exc.detail)
            self._checks.labels(provider, "unchecked").inc()
            return True
        if not first:
            log.warning("webhook_replayed", provider=provider, path=request.url.path)
            self._checks.labels(provider, "replayed").inc()
            return False
        self._checks.labels(provider, "first").inc()
        request.scope.setdefault(_SCOPE_KEY, []).append(key)
        return True

    async def forget(self, keys: list[str]) -> None:
        for key in keys:
            try:
                await self._registry.forget(key)
            except RegistryUnavailable as exc:  # it lapses with its window instead
                log.warning("replay_forget_unavailable", detail=exc.detail)


class ReplayRelease:
    """Pure ASGI, around the app: a request answered 5xx, or whose handler raised, is forgotten by the
    ``ReplayGuard`` that remembered it, so the carrier's retry of it is taken."""

    def __init__(self, app: ASGIApp, guard: ReplayGuard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        failed = False

        async def watched_send(message: Message) -> None:
            nonlocal failed
            if message["type"] == "http.response.start" and message["status"] >= 500:
                failed = True
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except BaseException:
            failed = True
            raise
        finally:
            keys = scope.get(_SCOPE_KEY)
            if failed and keys:
                await self.guard.forget(keys)
