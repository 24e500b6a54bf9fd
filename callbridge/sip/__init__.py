"""SIP trunk ingress: callbridge as a SIP user-agent server with RTP media (telephony-protocols.md §5).

Sans-I/O cores: ``message`` (SIP parsing), ``sdp`` (offer/answer), ``dialog``
(the UAS transactions and dialogs), ``rtp`` (packets, jitter buffer,
latching), ``dtmf`` (RFC 4733). ``server`` is the asyncio listener; each call
runs on the shared ``MediaStreamDriver`` with ``bridge.providers.sip``.
"""
