"""#40's admission under a burst: eight signed Twilio answer webhooks at the same moment against one ``callbridge
serve`` on Redis with ``server.max_calls = 2`` and two ``callbridge engine-server``s (echo agent) in its pool, the
shipped settings otherwise (the CPU budget on); each call hangs up 2.5 s in. Prints each try's connected and busy,
then the bridge's refusals by reason (``admission_refused``). The goal: 2 and 6 every try, refused for ``max_calls``.

Run: ``python bench/admission_burst.py [--tries 20]`` (from the checkout whose code it measures: its parent).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.carriers.twilio.sim import SimulatedTwilio  # noqa: E402
from callbridge.sim.carrier import CallerScript  # noqa: E402
from callbridge.sim.redis_server import running_redis  # noqa: E402
from callbridge.sim.runner import free_port  # noqa: E402
from tests.bridge.test_fleet import SECRET, Process, _start  # noqa: E402
from tests.bridge.twilio_e2e import short_speech  # noqa: E402
from tests.conftest import wait_http_ok  # noqa: E402


def _config(tmp: Path, redis_url: str, engine_ports: list[int], rest_url: str) -> Path:
    urls = ", ".join(f'"ws://127.0.0.1:{port}"' for port in engine_ports)
    lines = ["[engine]", 'kind = "realtime"', f"urls = [{urls}]", "[local_engine]", 'agent = "echo"', "[registry]",
             'backend = "redis"', f'redis_url = "{redis_url}"', "[server]", "max_calls = 2"]  # fmt: skip
    for section, values in SimulatedTwilio.bridge_settings(SECRET, rest_url).items():
        lines += [f"[{section}]", *(f"{key} = {json.dumps(value)}" for key, value in values.items())]
    config = tmp / "callbridge.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


async def _run(tries: int, redis_url: str) -> None:
    twilio = SimulatedTwilio("http://unused", SECRET)
    processes: list[Process] = []
    try:
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            engines = [free_port(), free_port()]
            config = _config(tmp, redis_url, engines, await twilio.start_rest(free_port()))
            started = [(f"engine-{i}", ["engine-server"], port, "/health") for i, port in enumerate(engines)]
            for label, args, port, health in [*started, ("bridge", ["serve"], free_port(), "/readyz")]:
                processes.append(process := _start(label, args, config, port, tmp))
                await asyncio.to_thread(wait_http_ok, process.url + health, process.process, timeout_s=60)
            bridge = processes[-1]
            twilio.bridge_url = bridge.url
            for index in range(tries):
                script = CallerScript(utterances=((300, short_speech(600)),), hangup_at_ms=2500)
                results = await asyncio.gather(*(twilio.place_call(script) for _ in range(8)))
                connected = sum(1 for result in results if result.streams)
                print(f"try {index + 1}: connected {connected}, busy {len(results) - connected}", flush=True)
                await asyncio.sleep(1.0)
            reasons = collections.Counter(str(event.get("reason")) for event in bridge.events("admission_refused"))
            print("refused by reason:", dict(reasons))
    finally:
        for process in processes:
            process.stop()
        await twilio.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=3)
    with running_redis() as redis_url:
        asyncio.run(_run(parser.parse_args().tries, redis_url))


if __name__ == "__main__":
    main()
