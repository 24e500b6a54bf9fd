"""One sans-I/O wire codec per carrier (Twilio, SignalWire, Telnyx, Plivo, Exotel, Vonage, AudioSocket)."""
