"""``[webrtc]``: the browser phone's section of the settings (``CALLBRIDGE_WEBRTC__…``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr

from callbridge.config_types import Section

__all__ = ["WebRtcSettings"]


class WebRtcSettings(Section):
    """The browser phone: ``/talk``, a page that calls the agent over WebRTC (Opus at 48 kHz, host candidates)."""

    enabled: bool = True
    """``/talk`` and its offer route are served; off: both answer 404."""
    token: Annotated[SecretStr, Field(min_length=16)] | None = None
    """The page and its offer take ``?token=`` (the page passes it on as ``Authorization: Bearer``). None: only a
    browser on this machine may call (a loopback peer, with no proxy's forwarding header): every other request is
    refused (403), so a bridge exposed without a token gives nobody its agent."""
    max_calls: Annotated[int, Field(ge=1, le=1000)] = 8
    """Browser calls up at once in this process; the next offer is refused (503) before anything is set up."""
    connect_timeout_s: Annotated[float, Field(gt=0, le=60)] = 10.0
    """From the answer, how long the browser has to connect (ICE, DTLS) and send its first audio; then the call ends."""
    idle_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    """A connected browser that sends no audio for this long is gone (a closed tab, a lost network): the call ends."""
    jitter_frames: Annotated[int, Field(ge=0, le=8)] = 1
    """How many 20 ms frames of the browser's audio arrive behind one before it is decoded and handed on: each is 20 ms
    more between the caller's words and the agent hearing them, against packets that come late or out of order.
    aiortc's own is 4 (80 ms); a browser on a LAN or this machine needs 1 (0 is the same as 1: a frame is known whole
    when the next arrives). A lost packet is waited for while 2 more arrive, then given up (``jitter.py``)."""
    context_parameters_from_query: bool = True
    """The page's query string (less ``token``) goes in the call's start as its parameters, for the application's
    ``CallContext`` (kept only where ``app.context_parameters`` allows them, as for every carrier)."""
