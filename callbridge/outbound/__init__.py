"""Calls the agent places (#42): the parts an outbound call adds to an inbound one, sans-I/O — a voicemail's beep
heard (``beep``), how fast a carrier may be dialled (``pacing``)."""
