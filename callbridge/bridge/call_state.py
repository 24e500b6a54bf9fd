"""The call stream's phase and every change of it (``CallSession``'s one transition table: h11's rule, all state in
the table). A pair not in ``TRANSITIONS`` is an error: the carrier's (out of order: a protocol error that ends the
call) or the driver's (``CallStateError``: a bug)."""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["CARRIER_TRIGGERS", "TRANSITIONS", "CallState", "CallStateError", "Trigger"]


class CallState(enum.Enum):
    AWAITING_START = "awaiting_start"
    STARTING = "starting"
    """``start`` received; the engine session is being opened or resumed."""
    LIVE = "live"
    DETACHED = "detached"
    """The socket dropped without ``stop``: the engine session waits for the next stream."""
    ENDING = "ending"
    """The engine failed mid-call: the caller hears the fallback tone, then the call is hung up."""
    ENDED = "ended"


class Trigger(enum.Enum):
    CONNECTED = "connected"
    STARTED = "started"
    ENGINE_BOUND = "engine_bound"
    START_REFUSED = "start_refused"
    CARRIER_EVENT = "carrier_event"
    STOPPED = "stopped"
    ENGINE_ENDED = "engine_ended"
    ENGINE_FAILED = "engine_failed"
    FALLBACK_PLAYED = "fallback_played"
    TRANSPORT_LOST = "transport_lost"
    FAILED = "failed"
    AGENT_ENDED = "agent_ended"
    """The agent hung up (``end_call``) or transferred the call."""
    REPLACED = "replaced"
    """Another stream took the engine session over (``session.replaced``): the call goes on there."""


CARRIER_TRIGGERS: Final = frozenset({Trigger.CARRIER_EVENT, Trigger.STARTED, Trigger.CONNECTED, Trigger.STOPPED})
"""The triggers the carrier's messages pull: one the state does not allow is the carrier's protocol error."""

_S, _T = CallState, Trigger
TRANSITIONS: Final[dict[tuple[CallState, Trigger], CallState]] = {
    (_S.AWAITING_START, _T.CONNECTED): _S.AWAITING_START,
    (_S.AWAITING_START, _T.STARTED): _S.STARTING,
    (_S.AWAITING_START, _T.TRANSPORT_LOST): _S.ENDED,
    (_S.AWAITING_START, _T.FAILED): _S.ENDED,
    (_S.STARTING, _T.ENGINE_BOUND): _S.LIVE,
    (_S.STARTING, _T.START_REFUSED): _S.ENDED,
    (_S.STARTING, _T.CARRIER_EVENT): _S.STARTING,
    (_S.STARTING, _T.STOPPED): _S.ENDED,
    (_S.STARTING, _T.TRANSPORT_LOST): _S.DETACHED,  # not the call's end: the carrier may reconnect
    (_S.STARTING, _T.FAILED): _S.ENDED,
    (_S.STARTING, _T.ENGINE_FAILED): _S.ENDING,
    (_S.LIVE, _T.CARRIER_EVENT): _S.LIVE,
    (_S.LIVE, _T.STOPPED): _S.ENDED,
    (_S.LIVE, _T.ENGINE_ENDED): _S.ENDED,
    (_S.LIVE, _T.TRANSPORT_LOST): _S.DETACHED,
    (_S.LIVE, _T.FAILED): _S.ENDED,
    (_S.LIVE, _T.ENGINE_FAILED): _S.ENDING,
    (_S.LIVE, _T.AGENT_ENDED): _S.ENDED,
    (_S.LIVE, _T.REPLACED): _S.DETACHED,  # not the call's end: its newer stream has the session
    (_S.ENDING, _T.CARRIER_EVENT): _S.ENDING,
    (_S.ENDING, _T.FALLBACK_PLAYED): _S.ENDED,
    (_S.ENDING, _T.STOPPED): _S.ENDED,
    (_S.ENDING, _T.TRANSPORT_LOST): _S.ENDED,
    (_S.ENDING, _T.FAILED): _S.ENDED,
}
"""Every state change of a call stream. A pair not listed is an error (``CallSession._transition``)."""


class CallStateError(Exception):
    """The driver called an input the call's state does not allow (a bug in the driver)."""
