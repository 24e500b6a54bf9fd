"""Calls the agent places (#42). What an application uses: ``DialRequest`` (a call to place) and ``Calls`` (what its
``started`` hook gets to place them with), answered ``DialAccepted`` or ``DialRefusal``. The parts an outbound call
adds to an inbound one, sans-I/O: who answered, a person or a machine, and when a machine's message may go
(``answer``), a voicemail's beep (``beep``), how fast a carrier may be dialled (``pacing``)."""

from callbridge.outbound.request import Calls, DialAccepted, DialRefusal, DialRequest

__all__ = ["Calls", "DialAccepted", "DialRefusal", "DialRequest"]
