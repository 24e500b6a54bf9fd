"""Recordings on disk and their upload (``RecordingStore``): a WAV whole after every append, a call's next stream
going on in the same file, a disk that says no or falls behind costing the call nothing, and the PUT to the
application's presigned URL (real HTTP over loopback)."""

from __future__ import annotations

import threading
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Request, Response
from prometheus_client import CollectorRegistry

from callbridge.bridge.metrics import BridgeMetrics
from callbridge.bridge.recording_store import RecordingStore, WavAppender, public_url
from callbridge.sim.runner import free_port, serving

MB = 1024 * 1024


def store(directory: Path, *, max_pending_bytes: int = 64 * MB) -> tuple[RecordingStore, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = BridgeMetrics(registry, memory_registry=True, local_engine=True)
    return RecordingStore(directory, metrics, max_pending_bytes=max_pending_bytes, upload_timeout_s=120), registry


def stereo(seconds: float, value: int) -> bytes:
    return np.full(int(seconds * 8000) * 2, value, dtype="<i2").tobytes()


def read(path: Path) -> tuple[tuple[int, int, int], np.ndarray]:
    with wave.open(str(path), "rb") as wav:
        shape = (wav.getnchannels(), wav.getframerate(), wav.getsampwidth())
        return shape, np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").reshape(-1, 2)


def test_the_file_is_whole_after_every_append(tmp_path: Path) -> None:
    path = tmp_path / "call.wav"
    wav = WavAppender(path, 8000)
    for second in range(3):
        wav.append(stereo(1, second + 1))
        shape, samples = read(path)  # read while still open, as after a crash
        assert shape == (2, 8000, 2) and len(samples) == 8000 * (second + 1)
    wav.close()


async def test_a_calls_next_stream_goes_on_in_its_file_and_another_rate_gets_its_own(tmp_path: Path) -> None:
    recordings, registry = store(tmp_path)
    for value in (1, 2):
        recording = recordings.open("CA123", 8000)
        assert await recordings.close(recording, stereo(1, value)) == tmp_path / "CA123.wav"
    _, samples = read(tmp_path / "CA123.wav")
    assert len(samples) == 16_000 and samples[0, 0] == 1 and samples[-1, 0] == 2
    wideband = recordings.open("CA123", 16000)
    assert await recordings.close(wideband, stereo(1, 3)) == tmp_path / "CA123.1.wav"
    assert registry.get_sample_value("callbridge_recordings_total", {"outcome": "written"}) == 3
    await recordings.aclose()


async def test_two_streams_of_a_call_at_once_write_one_file(tmp_path: Path) -> None:
    """A reconnect's stream binds before the dropped one has closed: both go on in the same file (one handle, its
    header counting both), and it closes with the last of them."""
    recordings, _ = store(tmp_path)
    old, new = recordings.open("CA7", 8000), recordings.open("CA7", 8000)
    recordings.write(old, stereo(1, 1))
    recordings.write(new, stereo(1, 2))
    assert await recordings.close(old, stereo(0.5, 1)) == tmp_path / "CA7.wav"
    assert new.file is not None and not new.file._file.closed  # still the new stream's
    assert await recordings.close(new, stereo(0.5, 2)) == tmp_path / "CA7.wav"
    assert old.file is new.file and new.file._file.closed
    _, samples = read(tmp_path / "CA7.wav")
    assert len(samples) == 3 * 8000 and list(samples[::4000, 0]) == [1, 1, 2, 2, 1, 2]
    await recordings.aclose()


async def test_a_call_id_is_never_a_path(tmp_path: Path) -> None:
    recordings, _ = store(tmp_path / "recordings")
    recording = recordings.open("../../etc/passwd", 8000)
    path = await recordings.close(recording, stereo(0.1, 1))
    assert path is not None and path.parent == tmp_path / "recordings" and path.name.startswith("call-")
    await recordings.aclose()


async def test_a_disk_that_says_no_is_logged_and_costs_the_call_nothing(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    recordings, registry = store(blocked)
    recording = recordings.open("CA1", 8000)
    recordings.write(recording, stereo(1, 1))
    assert await recordings.close(recording, stereo(1, 1)) is None
    assert recording.failed is not None and recording.failed.startswith("FileExistsError")  # mkdir of a file's path
    assert registry.get_sample_value("callbridge_recordings_total", {"outcome": "write_failed"}) == 1
    await recordings.aclose()


async def test_what_waits_for_the_disk_is_bounded_over_all_calls(tmp_path: Path) -> None:
    recordings, registry = store(tmp_path, max_pending_bytes=100_000)
    disk = threading.Event()
    recordings._writer.submit(disk.wait)  # a disk that has fallen behind: nothing is written meanwhile
    calls = [recordings.open(f"CA{i}", 8000) for i in range(4)]
    for recording in calls:  # 4 × 32 KB at once: the fourth finds the bound taken
        recordings.write(recording, stereo(1, 1))
    assert recordings.pending_bytes <= 100_000
    disk.set()
    assert sum(recording.dropped_chunks for recording in calls) >= 1
    assert (registry.get_sample_value("callbridge_recordings_total", {"outcome": "chunk_dropped"}) or 0) >= 1
    for recording in calls:
        await recordings.close(recording, None)
    assert recordings.pending_bytes == 0
    await recordings.aclose()


@asynccontextmanager
async def bucket(answers: list[int]) -> AsyncIterator[tuple[str, dict[str, bytes]]]:
    """A presigned-URL stand-in: PUT stores the body under its path, answering each status of ``answers`` in turn
    (then 200)."""
    stored: dict[str, bytes] = {}
    app = FastAPI()

    @app.put("/{key:path}")
    async def put(key: str, request: Request) -> Response:
        status = answers.pop(0) if answers else 200
        if status == 200:
            assert request.headers["content-type"] == "audio/wav" and request.query_params["X-Amz-Signature"] == "s3cr3t"
            stored[key] = await request.body()
        return Response(status_code=status)

    port = free_port()
    async with serving(app, port):
        yield f"http://127.0.0.1:{port}", stored


async def test_a_finished_recording_is_put_to_the_presigned_url_retried_once_when_it_fails(tmp_path: Path) -> None:
    recordings, registry = store(tmp_path)
    path = await recordings.close(recordings.open("CA9", 8000), stereo(0.5, 7))
    assert path is not None
    async with bucket([503]) as (base, stored):
        url = f"{base}/bucket/CA9.wav?X-Amz-Signature=s3cr3t"
        assert await recordings.upload(path, url, "CA9")
    assert stored["bucket/CA9.wav"] == path.read_bytes()
    assert public_url(url) == f"{base}/bucket/CA9.wav"  # what the report and the log show: no signature
    assert registry.get_sample_value("callbridge_recordings_total", {"outcome": "uploaded"}) == 1
    async with bucket([403]) as (base, stored):  # an expired URL: refused, not tried again
        assert not await recordings.upload(path, f"{base}/bucket/CA9.wav?X-Amz-Signature=s3cr3t", "CA9")
        assert stored == {}
    assert registry.get_sample_value("callbridge_recordings_total", {"outcome": "upload_failed"}) == 1
    await recordings.aclose()
