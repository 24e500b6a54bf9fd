"""The call bridge: carrier wire codecs (``providers``), the per-call state machine, playout, and the HTTP surface."""
