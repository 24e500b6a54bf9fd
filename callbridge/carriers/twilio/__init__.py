"""Twilio Media Streams: TwiML answer, signed webhooks and upgrade, REST hang-up and transfer."""

from callbridge.carriers.spec import Capabilities, CarrierSpec
from callbridge.carriers.twilio.settings import TwilioSettings

__all__ = ["SPEC", "TwilioSettings"]

SPEC = CarrierSpec(
    name="twilio",
    transport="websocket",
    capabilities=Capabilities(marks=True, flush=True, reconnect=True, dtmf_out=False, transfer=True),
    section="twilio",
    secret="auth_token",
    carrier="http:CARRIER",
    codec="wire:TwilioCodec",
    simulator="sim:SimulatedTwilio",
    recognises="wire:recognises",
    far_end="sim:FAR_END",
    direct_protocol="Twilio Media Streams",
)
