"""What ``callbridge engine-server`` sends, event by event, for one exchange over a real websocket: the opening
``session.update``, one spoken turn (server VAD), a ``response.cancel``, a user text item, a heartbeat.

    python bench/engine_event_sequence.py

Run from a checkout's root (it uses the tests' in-process server); run it in an older checkout (``git worktree
add``) to compare. ``tests/engine/test_conformance.py`` checks the sequence against vllm-omni's own projection.
"""

from __future__ import annotations

import asyncio
import collections
import sys

sys.path.insert(0, ".")

from callbridge.engine.local.core import LocalEngineOptions  # noqa: E402
from tests.engine.audio import caller_speech_16k, chunks, silence  # noqa: E402
from tests.engine.serving import RawClient, engine_server  # noqa: E402


async def main() -> None:
    async with engine_server(LocalEngineOptions(generation_speed=1.0, chunk_ms=200)) as running:
        client = await RawClient.connect(running.url)
        await client.send({"type": "session.update", "session": {"input_audio_format": "pcm16", "sample_rate_hz": 16000, "turn_detection": {"type": "server_vad"}}})
        kinds: list[str] = []
        for chunk in chunks(silence(200) + caller_speech_16k() + silence(700)):
            await client.append(chunk)
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
        await client.send({"type": "response.cancel"})
        await asyncio.sleep(0.3)
        await client.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
        await client.send({"type": "session.heartbeat"})
        try:
            while True:
                kinds.append((await client.recv(timeout_s=1.0))["type"])
        except TimeoutError:
            pass
        print(f"{len(kinds)} events of {len(set(kinds))} types:", " ".join(kinds))
        print(sorted(collections.Counter(kinds).items()))


if __name__ == "__main__":
    asyncio.run(main())
