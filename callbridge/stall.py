"""How late a timer must fire to show that this process itself did not run (stopped, swapped out, its VM frozen).

Why: after such a stall the event loop runs the timers that came due meanwhile before it reads the sockets (uvloop),
so a silence limit — the carrier's idle limit, SIP's RTP timeout, the engine server's reconnect budget, the
caller's silence prompt and goodbye (``bridge/turns.py``) — finds the peer silent for as long as this process was,
while the peer's packets of that time sit unread. Each such limit,
found due this late, waits for the reader's turn (or counts from the stall's end) before it blames the peer.
"""

from __future__ import annotations

from typing import Final

__all__ = ["PROCESS_STALL_MS"]

PROCESS_STALL_MS: Final = 500
"""A timer at least this late after its deadline means this process did not run meanwhile. Ordinary lateness under
load is tens of milliseconds."""
