"""Calls the agent places (#42): the parts an outbound call adds to an inbound one, sans-I/O — what decides "person
or machine" and hears a voicemail's beep (``beep``)."""
