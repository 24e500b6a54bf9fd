"""What bridge-mode barge-in adds to a call's CPU (#41: at most 0.5 CPU-ms per call-second while the agent speaks,
nothing while it does not): ``BridgeBargeIn.caller_audio`` per 20 ms of the caller's audio at 16 kHz, with the
agent's frame the caller hears decoded from μ-law for its level (as ``AgentSpeech.playing_level_db`` does; the
ledger's lookup of that frame is left out), the echo gate re-learning its path as it goes.

    python bench/bridge_barge_in_cpu.py [--calls 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

with warnings.catch_warnings():  # deprecated in 3.11, kept here as the project's codecs keep it (audioop-lts on 3.13)
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import soxr  # noqa: E402

from callbridge.bridge.bridge_barge_in import BridgeBargeIn  # noqa: E402
from callbridge.bridge.echo_gate import level_db  # noqa: E402
from callbridge.bridge.interruption_judge import BridgeBargeInSettings  # noqa: E402
from callbridge.sim.runner import load_wav_8k, sample_caller_wav  # noqa: E402


class _Agent:
    """The agent's speech as the part reads it: the level of the frame the caller hears (μ-law, decoded)."""

    def __init__(self, frames: list[bytes] | None) -> None:
        self.frames, self.index = frames, 0
        self.echo_ms = 0

    def playing_level_db(self, now_ms: int) -> float:
        if self.frames is None:
            return 0.0
        self.index += 1
        return level_db(audioop.ulaw2lin(self.frames[self.index % len(self.frames)], 2))

    def playing_moved_ms(self, since_ms: int) -> int:
        return 0  # a model the carrier's marks never moved (the ledger's deque of moves, empty)

    def pause(self, now_ms: int) -> bool:
        return True

    def resume(self, now_ms: int) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    speech_8k = load_wav_8k(sample_caller_wav())
    agent = [audioop.lin2ulaw(speech_8k[i : i + 320], 2) for i in range(0, len(speech_8k) - 320, 320)]
    caller = soxr.resample(np.frombuffer(speech_8k, dtype="<i2"), 8000, 16000).astype("<i2").tobytes()
    frames = [caller[i : i + 640] for i in range(0, len(caller) - 640, 640)] * 3  # 11 s: the caller's line, echo or not
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}; {args.calls} calls of {len(frames) * 20} ms")
    for label, heard in (("the agent speaking", agent), ("the agent quiet", None)):
        costs = []
        for _ in range(args.calls):
            part, speech = BridgeBargeIn(16000, BridgeBargeInSettings()), _Agent(heard)
            started = time.process_time()
            for k, frame in enumerate(frames):
                part.caller_audio(frame, (k + 1) * 20, k * 20, speech, said_until_ms=(k + 1) * 20)  # type: ignore[arg-type]
            costs.append((time.process_time() - started) * 1000 / (len(frames) * 0.02))
        print(f"{label}: median {statistics.median(costs):.3f} CPU-ms per call-second (min {min(costs):.3f}, max {max(costs):.3f})")


if __name__ == "__main__":
    main()
