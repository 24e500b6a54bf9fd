"""Calls the agent places (#42): the parts an outbound call adds to an inbound one, sans-I/O — who answered, a person
or a machine, and when a machine's message may go (``answer``), a voicemail's beep (``beep``), how fast a carrier may
be dialled (``pacing``)."""
