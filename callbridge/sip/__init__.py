"""SIP trunk ingress: callbridge as a SIP user-agent server with RTP media (telephony-protocols.md §5).

Sans-I/O cores: ``message`` (SIP parsing), ``sdp`` (offer/answer), ``dialog``
(the UAS transactions and dialogs), ``rtp`` (packets, jitter buffer,
latching), ``dtmf`` (RFC 4733), ``registration`` (the REGISTER client) with
``digest`` (its credentials). ``server`` is the asyncio listener, and
``registrar_client`` drives the registrations from its socket; each call
runs on the shared ``MediaStreamDriver`` with ``bridge.providers.sip``.
"""
