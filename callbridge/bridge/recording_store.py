"""Recordings on disk and off it: one canonical PCM WAV per call (``<call id>.wav``), appended as the call goes with
its header right after every append (a crash loses at most the last chunk, about a second), written by one
thread for every call in order; what waits for the disk is bounded over all calls (past it a chunk is dropped,
logged and counted, never held). A call that comes back to this process goes on in its file. When the call is
over, the file may be PUT to the URL the call's assistant gave (a presigned URL), with retries."""

from __future__ import annotations

import asyncio
import hashlib
import re
import struct
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final
from urllib.parse import urlsplit, urlunsplit

import httpx

from callbridge.bridge.app_events import RETRY_DELAYS_S
from callbridge.bridge.metrics import BridgeMetrics
from callbridge.bridge.recording import CHANNELS
from callbridge.logging import get_logger
from callbridge.outbound_http import http_client

__all__ = ["CallRecording", "RecordingStore", "WavAppender", "public_url"]

log = get_logger(__name__)

_HEADER: Final = struct.Struct("<4sI4s4sIHHIIHH4sI")
"""RIFF, size, WAVE, "fmt ", 16, PCM (1), channels, rate, byte rate, block align, bits, "data", data size."""
_SAMPLE_BYTES: Final = 2
_SAFE_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")
_UPLOAD_CHUNK: Final = 256 * 1024


class WavAppender:
    """A 16-bit PCM WAV that grows: ``append`` writes the samples, then the two sizes in the header, so the file is
    whole after every append. An existing file of the same format is gone on with (a call's next stream)."""

    def __init__(self, path: Path, rate_hz: int, channels: int = CHANNELS) -> None:
        self.path = path
        self.rate_hz = rate_hz
        self._header = (rate_hz, channels)
        existing = path.stat().st_size if path.exists() else 0
        if existing and not self._same_format(path):
            raise FileExistsError(f"{path} holds audio of another format")
        if existing:
            self._file: BinaryIO = path.open("r+b")
            self.data_bytes = existing - _HEADER.size
        else:
            self._file = path.open("w+b")
            self.data_bytes = 0
            self._file.write(self._pack())

    def _pack(self) -> bytes:
        rate, channels = self._header
        block = channels * _SAMPLE_BYTES
        return _HEADER.pack(
            b"RIFF", 36 + self.data_bytes, b"WAVE", b"fmt ", 16, 1, channels, rate, rate * block, block, _SAMPLE_BYTES * 8,
            b"data", self.data_bytes,
        )  # fmt: skip

    def _same_format(self, path: Path) -> bool:
        with path.open("rb") as existing:
            head = existing.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return False
        fields = _HEADER.unpack(head)
        return fields[0] == b"RIFF" and fields[2] == b"WAVE" and (fields[7], fields[6]) == self._header and fields[11] == b"data"

    def append(self, data: bytes) -> None:
        file = self._file
        file.seek(0, 2)
        file.write(data)
        self.data_bytes += len(data)
        file.seek(0)
        file.write(self._pack())
        file.flush()

    def close(self) -> None:
        self._file.close()


@dataclass(slots=True)
class CallRecording:
    """One stream's share of a call's recording: its file, and how its writing went."""

    call_id: str
    path: Path
    rate_hz: int
    file: WavAppender | None = None
    failed: str | None = None
    """Why writing stopped (the disk said no), if it did."""
    dropped_chunks: int = 0


class RecordingStore:
    """The process's recordings (``[recording]``): see the module docstring."""

    def __init__(self, directory: Path, metrics: BridgeMetrics, *, max_pending_bytes: int, upload_timeout_s: float) -> None:
        self.directory = directory
        self.metrics = metrics
        self.max_pending_bytes = max_pending_bytes
        self.upload_timeout_s = upload_timeout_s
        self.pending_bytes = 0
        """Handed to the writer and not yet written (the loop adds, the writer thread takes off: ``_pending_lock``)."""
        self._pending_lock = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recording")
        self._files: dict[Path, tuple[WavAppender, int]] = {}
        """Open files and how many streams write to each (the writer thread's alone): a call's new stream that
        binds before its old one has closed goes on in the same file, not a second handle on it."""

    def open(self, call_id: str, rate_hz: int) -> CallRecording:
        """A stream's recording of ``call_id`` (nothing touches the disk here: the thread opens the file)."""
        name = call_id if _SAFE_NAME.fullmatch(call_id) and not call_id.startswith(".") else _hashed(call_id)
        return CallRecording(call_id, self.directory / f"{name}.wav", rate_hz)

    def write(self, recording: CallRecording, data: bytes) -> None:
        """Hand a chunk to the writer; never waits. Past ``max_pending_bytes`` waiting: dropped and counted."""
        if recording.failed is not None:
            return
        size = len(data)
        with self._pending_lock:
            taken = self.pending_bytes + size <= self.max_pending_bytes
            if taken:
                self.pending_bytes += size
        if not taken:
            recording.dropped_chunks += 1
            self.metrics.recordings.labels("chunk_dropped").inc()
            if recording.dropped_chunks == 1:
                log.warning("recording_chunk_dropped", call_id=recording.call_id, pending_bytes=self.pending_bytes)
            return
        self._writer.submit(self._append, recording, data)

    def _append(self, recording: CallRecording, data: bytes) -> None:
        """In the writer thread."""
        try:
            if recording.failed is None:
                if recording.file is None:
                    self.directory.mkdir(parents=True, exist_ok=True)
                    recording.file = self._open_file(recording)
                recording.file.append(data)
        except OSError as exc:
            recording.failed = f"{type(exc).__name__}: {exc.strerror or exc}"
            self.metrics.recordings.labels("write_failed").inc()
            log.warning("recording_write_failed", call_id=recording.call_id, path=str(recording.path), error=recording.failed)
        finally:
            with self._pending_lock:
                self.pending_bytes -= len(data)

    def _open_file(self, recording: CallRecording) -> WavAppender:
        """In the writer thread: the call's file, gone on with (open already for another of its streams, or on
        disk); where a stream of another rate wrote it, ``<call id>.<n>.wav``."""
        base = recording.path
        for n in range(100):
            path = base if n == 0 else base.with_name(f"{base.stem}.{n}.wav")
            shared = self._files.get(path)
            if shared is not None and shared[0].rate_hz != recording.rate_hz:
                continue
            if shared is None:
                try:
                    shared = (WavAppender(path, recording.rate_hz), 0)
                except FileExistsError:
                    continue
            self._files[path] = (shared[0], shared[1] + 1)
            recording.path = path
            return shared[0]
        raise FileExistsError(f"{base}: too many recordings of other formats")

    async def close(self, recording: CallRecording, last: bytes | None) -> Path | None:
        """The stream's last chunk written and its file closed; the file's path (None: nothing was written)."""
        if last:
            self.write(recording, last)
        closing = self._writer.submit(self._close, recording)
        await asyncio.wrap_future(closing)
        if recording.failed is None and recording.file is not None:
            self.metrics.recordings.labels("written").inc()
            return recording.path
        return None

    def _close(self, recording: CallRecording) -> None:
        """In the writer thread: the stream is done with its file; closed when no other stream writes to it."""
        shared = self._files.get(recording.path)
        if recording.file is None or shared is None or shared[0] is not recording.file:
            return
        if shared[1] > 1:
            self._files[recording.path] = (shared[0], shared[1] - 1)
            return
        del self._files[recording.path]
        recording.file.close()

    async def upload(self, path: Path, url: str, call_id: str) -> bool:
        """PUT the finished recording to ``url``, with retries (``RETRY_DELAYS_S``); whether it went."""
        failure = "error"
        for delay_s in (0.0, *RETRY_DELAYS_S):
            if delay_s:
                await asyncio.sleep(delay_s)
            try:
                async with http_client(timeout=self.upload_timeout_s) as http:
                    headers = {"Content-Type": "audio/wav", "Content-Length": str(path.stat().st_size)}
                    answer = await http.put(url, content=_chunks(path), headers=headers)
                if answer.is_success:
                    self.metrics.recordings.labels("uploaded").inc()
                    log.info("recording_uploaded", call_id=call_id, url=public_url(url))
                    return True
                failure = f"status_{answer.status_code}"
                if answer.status_code < 500 and answer.status_code != 429:
                    break  # refused: another try is refused too (an expired presigned URL)
            except httpx.HTTPError as exc:
                failure = type(exc).__name__
            except OSError as exc:
                failure = f"{type(exc).__name__}: {exc.strerror or exc}"
                break
        self.metrics.recordings.labels("upload_failed").inc()
        log.warning("recording_upload_failed", call_id=call_id, url=public_url(url), failure=failure, path=str(path))
        return False

    async def aclose(self) -> None:
        """Every write handed over is done (the files whole) before the process ends."""
        await asyncio.to_thread(self._writer.shutdown, wait=True)


async def _chunks(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as file:
        while chunk := await asyncio.to_thread(file.read, _UPLOAD_CHUNK):
            yield chunk


def public_url(url: str) -> str:
    """``url`` without its query and fragment (a presigned URL's signature is a secret)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _hashed(call_id: str) -> str:
    return "call-" + hashlib.sha256(call_id.encode()).hexdigest()[:32]
