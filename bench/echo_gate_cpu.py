"""What the echo gate (``bridge/echo_gate.py``, #41) costs a call: CPU-ms per call-second, the gate alone (``far``
and ``near`` per 20 ms frame, re-learning the path every 200 ms), on a call of the bundled utterance twice as the
agent and its echo at -10 dB, 200 ms late. The issue's budget for what bridge mode adds while the agent speaks:
0.5 CPU-ms per call-second.

    python bench/echo_gate_cpu.py [--calls 50]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.bridge.echo_gate import EchoGate  # noqa: E402
from callbridge.sim.caller_line import echo_of  # noqa: E402
from callbridge.sim.runner import load_wav_8k, sample_caller_wav  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    agent = bytes(16000) + load_wav_8k(sample_caller_wav()) * 2
    frames = len(agent) // 320
    far = [agent[k * 320 : (k + 1) * 320] for k in range(frames)]
    near = [echo_of(agent, k * 20, delay_ms=200, down_db=10) for k in range(frames)]
    costs = []
    for _ in range(args.calls):
        gate = EchoGate()
        started = time.process_time()
        for k in range(frames):
            gate.far(far[k])
            gate.near(near[k])
        costs.append((time.process_time() - started) * 1000 / (frames * 0.02))
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}; {args.calls} calls of {frames * 20} ms")
    print(f"echo gate: median {statistics.median(costs):.3f} CPU-ms per call-second (min {min(costs):.3f}, max {max(costs):.3f})")


if __name__ == "__main__":
    main()
