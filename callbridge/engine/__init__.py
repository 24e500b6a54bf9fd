"""Duplex speech-model sessions: the port the bridge codes against and its engines (vllm-omni over the wire,
vllm-omni in process, and the embedded CPU engine)."""
