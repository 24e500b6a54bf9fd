"""What the console shows of a call, made from its journal alone (``registry_journal``): its card in the calls list
(carrier, direction, numbers, state, times, engine server, turn latency, heard ratio, the end) and its timeline in
words. Pure: the journal in, plain data out; ``console_http`` reads the journal and serves these.
"""

from __future__ import annotations

import statistics
from typing import Any, Final

import orjson

from callbridge.bridge.registry_journal import JournalPage

__all__ = ["CallCard", "call_card", "call_view", "matches", "timeline"]

CallCard = dict[str, Any]
"""A call's row in the console (JSON-ready): see ``call_card``."""

_STATES: Final = {
    "call.dialing": "dialing", "call.ringing": "ringing", "call.started": "answering", "call.answered": "up", "call.resumed": "up",
    "call.ended": "ended", "call.failed": "failed",
}  # fmt: skip


def _events(page: JournalPage) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for entry in page.entries:
        try:
            event = orjson.loads(entry)
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict) and isinstance(event.get("type"), str):
            events.append(event)
    return events


def call_card(call_id: str, page: JournalPage) -> CallCard | None:
    """The call's row: None where its journal has expired (or never had its context) (``_card``)."""
    return _card(call_id, page.header, _events(page))


def call_view(call_id: str, page: JournalPage) -> tuple[CallCard, list[dict[str, Any]], dict[str, Any] | None] | None:
    """The call's card, its timeline and its end-of-call report (None: not over), its journal read once; None where
    the journal has expired."""
    events = _events(page)
    card = _card(call_id, page.header, events)
    if card is None:
        return None
    report = next((e.get("data", {}).get("report") for e in reversed(events) if e["type"] == "call.ended"), None)
    return card, _timeline(events), report if isinstance(report, dict) else None


def _card(call_id: str, header: str | None, events: list[dict[str, Any]]) -> CallCard | None:
    """The call's row from its context and its events (None: no context).

    ``state``: dialing, ringing, answering (its assistant chosen), up (its media flowing), ended or failed;
    ``turn_ms``: the last turn's latency and ``turn_p50_ms`` the median of the call's turns; ``heard_ratio``: of the
    replies the caller cut off, the share they heard of what the engine had generated (None: no barge-in)."""
    if header is None:
        return None
    context = orjson.loads(header)
    card: CallCard = {
        "call_id": call_id, "carrier": context.get("carrier"), "direction": context.get("direction"),
        "caller": context.get("caller_number"), "called": context.get("called_number"), "dial_id": context.get("dial_id"),
        "state": "up", "started_at": None, "answered_at": None, "ended_at": None, "engine": None, "turns": 0,
        "turn_ms": None, "turn_p50_ms": None, "barge_ins": 0, "heard_ratio": None, "dtmf": 0, "tools": 0,
        "end_reason": None, "ended_by": None, "recording": False,
    }  # fmt: skip
    latencies: list[float] = []
    heard = generated = 0.0
    for event in events:
        kind, data, at = event["type"], event.get("data") or {}, event.get("at")
        card["state"] = _STATES.get(kind, card["state"])
        if card["started_at"] is None:
            card["started_at"] = at
        match kind:
            case "call.answered" | "call.resumed":
                card["answered_at"] = card["answered_at"] or at
                card["engine"] = data.get("engine", card["engine"])
            case "turn" if isinstance(data.get("latency_ms"), int | float):
                latencies.append(data["latency_ms"])
            case "barge-in":
                card["barge_ins"] += 1
                if isinstance(data.get("generated_ms"), int | float) and data["generated_ms"] > 0:
                    heard, generated = heard + min(data.get("heard_ms") or 0, data["generated_ms"]), generated + data["generated_ms"]
            case "dtmf":
                card["dtmf"] += 1
            case "tool":
                card["tools"] += 1
            case "call.failed":
                card["ended_at"], card["end_reason"] = at, data.get("reason")
            case "call.ended":
                report = data.get("report") or {}
                card["ended_at"], card["end_reason"], card["ended_by"] = at, report.get("end_reason"), report.get("ended_by")
                card["started_at"] = report.get("started_at", card["started_at"])
                card["recording"] = bool(report.get("recording"))
                card["engine"] = report.get("engine_endpoint", card["engine"])
    card["turns"] = len(latencies)
    if latencies:
        card["turn_ms"], card["turn_p50_ms"] = round(latencies[-1]), round(statistics.median(latencies))
    if generated:
        card["heard_ratio"] = round(heard / generated, 3)
    return card


def matches(card: CallCard, *, number: str | None, carrier: str | None, reason: str | None) -> bool:
    """The finished calls' search: ``number`` anywhere in either number (digits as typed), ``carrier`` by name,
    ``reason`` anywhere in the end reason; each only where given."""
    if number and not any(number in (card.get(key) or "") for key in ("caller", "called")):
        return False
    if carrier and card.get("carrier") != carrier:
        return False
    return not reason or reason in (card.get("end_reason") or "")


def _s(ms: float | None) -> str:
    return "?" if ms is None else f"{ms / 1000:.1f} s"


def _describe(kind: str, data: dict[str, Any]) -> str:
    """One event in words."""
    match kind:
        case "call.dialing":
            return "dialling"
        case "call.ringing":
            return "ringing"
        case "call.started":
            return "assistant chosen: answering"
        case "call.answered":
            return f"answered: media flowing, engine {data.get('engine') or 'embedded'}"
        case "call.resumed":
            how = "its session resumed" if data.get("session") == "resumed" else "a new engine session (the last one was lost)"
            return f"stream {data.get('stream')}: {how}, engine {data.get('engine') or 'embedded'}"
        case "call.machine_detected":
            return f"answered by {data.get('answered_by')} ({data.get('why') or 'no reason given'}) after {_s(data.get('after_ms'))}"
        case "call.voicemail_left":
            return "voicemail left"
        case "turn":
            return f"turn: the agent answered {data.get('latency_ms', '?')} ms after the caller stopped"
        case "barge-in":
            return f"barge-in ({data.get('decided_by') or 'engine'}): the caller heard {_s(data.get('heard_ms'))} of {_s(data.get('generated_ms'))}"
        case "dtmf":
            return f"key {data.get('digit')}"
        case "silence":
            return f"silence of {_s(data.get('silent_ms'))}: {data.get('action')}"
        case "tool":
            return f"tool {data.get('name')}: {'ok' if data.get('ok') else 'failed'} in {data.get('elapsed_ms', '?')} ms"
        case "transfer":
            return f"transfer to {data.get('target')}: {'ok' if data.get('ok') else 'failed'}"
        case "call.failed":
            return f"not answered: {data.get('reason')} {data.get('detail') or ''}".rstrip()
        case "call.ended":
            report = data.get("report") or {}
            resumes = f", {report['engine_resumes']} resume(s)" if report.get("engine_resumes") else ""
            return (
                f"ended: {report.get('end_reason')} (by the {report.get('ended_by')}) after {_s(report.get('duration_ms'))}, "
                f"{report.get('streams', 1)} stream(s){resumes}; first agent audio {report.get('first_agent_audio_ms', '?')} ms"
            )
    return kind


def timeline(page: JournalPage) -> list[dict[str, Any]]:
    """The call's events in order, each with ``t_ms`` (from the first) and ``text``: what the console lists."""
    return _timeline(_events(page))


def _timeline(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    first = next((e["at"] for e in events if isinstance(e.get("at"), int | float)), 0.0)
    return [
        {"t_ms": round((event.get("at", first) - first) * 1000), "type": event["type"], "text": _describe(event["type"], event.get("data") or {}), "data": event.get("data") or {}}
        for event in events
    ]  # fmt: skip
