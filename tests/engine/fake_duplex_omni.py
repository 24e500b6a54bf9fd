"""A faithful fake of ``vllm_omni.entrypoints.duplex_omni`` (``DuplexOmni``, ``DuplexSessionHandle``).

It keeps their contract (reference §3.2; 0.30.0 ``entrypoints/duplex_omni.py``):
the handle is registered before the open RPC; ``resume_session`` is a
compare-and-swap on the lease generation (``session_resume_conflict``);
``detach_session`` is fenced on it; ``events()`` has a single consumer and
ends after a terminal event; ``close_session`` waits for ``session.closed``;
expiry closes the handle; ``max_sessions`` gives a retryable
``resource_exhausted``. Commands and events are vllm-omni's real classes
(loaded from the wheel), and sessions are built with the real
``DuplexSessionConfig.from_realtime``, so what the adapter sends is checked by
vllm-omni's own translator and validators. The "model" echoes each committed
turn: it requires the ``pcm_f32le`` 16 kHz that ``command_from_realtime``
produces, and answers in the session's ``response_format`` (``wav`` when
opened from a bare config — the gotcha the adapter must avoid).
"""

from __future__ import annotations

import asyncio
import base64
import io
import sys
import types
import uuid
import wave
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
import soxr

from tests.engine.vllm_omni_wheel import load_vllm_omni


class DuplexSessionError(Exception):
    def __init__(self, message: str, *, code: str = "internal_error", retryable: bool = False, session_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable
        self.session_id = session_id


class DuplexSessionHandle:
    def __init__(self, omni: DuplexOmni, session_id: str) -> None:
        from vllm_omni.engine.duplex.config import DuplexCapabilities

        self._omni = omni
        self.session_id = session_id
        self.capabilities = DuplexCapabilities()
        self.public_session: dict[str, object] = {}
        self.lease_generation = 0
        self._outbox: asyncio.Queue[Any] = asyncio.Queue()
        self._closed = False
        self._close_reason: str | None = None
        self._closed_event = asyncio.Event()
        self._consumer_active = False
        self.commands: list[Any] = []

    @property
    def closed(self) -> bool:
        return self._closed

    async def submit(self, command: Any) -> None:
        if self._closed:
            raise DuplexSessionError(f"duplex session {self.session_id} is closed", code="session_closed", session_id=self.session_id)
        self.commands.append(command)
        self._omni._model_step(self, command)

    async def close(self, *, reason: str = "client_close", timeout: float | None = 10.0) -> None:
        if self._closed:
            return
        await self._omni.close_session(self.session_id, reason=reason, timeout=timeout)

    async def events(self) -> AsyncIterator[Any]:
        if self._consumer_active:
            raise RuntimeError(f"duplex session {self.session_id} already has an active events() consumer")
        self._consumer_active = True
        try:
            while True:
                if self._closed and self._outbox.empty():
                    return
                event = await self._outbox.get()
                if event is None:
                    if self._closed and self._outbox.empty():
                        return
                    continue
                yield event
                if event.is_terminal:
                    return
        finally:
            self._consumer_active = False

    async def wait_closed(self) -> str:
        await self._closed_event.wait()
        return self._close_reason or "closed"

    def _deliver(self, event: Any) -> None:
        from vllm_omni.engine.duplex.events import SessionClosed

        self._outbox.put_nowait(event)
        if isinstance(event, SessionClosed):
            self._mark_closed(event.reason or event.type)

    def _mark_closed(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        self._closed_event.set()
        self._outbox.put_nowait(None)


class DuplexOmni:
    def __init__(self, model: str = "fake/duplex", *, max_sessions: int = 4) -> None:
        from vllm_omni.engine.duplex.config import DuplexCapabilities

        self.model = model
        self.max_sessions = max_sessions
        self.duplex_capabilities = DuplexCapabilities(
            supports_barge_in=True, supports_playback_ack=True, supports_session_resume=True, supports_audio_truncate=True
        )
        self._handles: dict[str, DuplexSessionHandle] = {}
        self.opened_with: list[object] = []
        self._state: dict[str, dict[str, Any]] = {}

    @property
    def sessions(self) -> Mapping[str, DuplexSessionHandle]:
        return dict(self._handles)

    def get_session(self, session_id: str) -> DuplexSessionHandle | None:
        return self._handles.get(session_id)

    async def open_session(self, config: Any = None, *, timeout: float | None = 10.0) -> DuplexSessionHandle:
        from vllm_omni.engine.duplex.config import DuplexSessionConfig
        from vllm_omni.engine.duplex.events import SessionCreated

        self.opened_with.append(config)
        session_id = f"duplex-{uuid.uuid4().hex}"
        if isinstance(config, Mapping):
            resolved = DuplexSessionConfig.from_realtime(config, model=self.model)
        else:
            resolved = config if config is not None else DuplexSessionConfig(model=self.model)
        handle = DuplexSessionHandle(self, session_id)
        self._handles[session_id] = handle  # registered before the RPC, as the real one
        await asyncio.sleep(0)
        if len([h for h in self._handles.values() if not h.closed]) > self.max_sessions:
            self._handles.pop(session_id)
            raise DuplexSessionError(
                f"duplex_session_capacity_exhausted: limit={self.max_sessions}", code="resource_exhausted", retryable=True
            )
        handle.capabilities = self.duplex_capabilities
        handle.public_session = {
            "id": session_id,
            "object": "realtime.session",
            "response_format": resolved.response_format,
            "capabilities": self.duplex_capabilities.as_dict(),
        }
        self._state[session_id] = {"format": resolved.response_format, "input": [], "epoch": 0, "detached": False}
        handle._deliver(SessionCreated(session_id=session_id, session=handle.public_session))
        return handle

    async def resume_session(self, session_id: str, *, expected_lease_generation: int, timeout: float | None = 10.0, on_abandoned: Any = None) -> DuplexSessionHandle:
        handle = self._require(session_id)
        if expected_lease_generation != handle.lease_generation:
            raise DuplexSessionError(
                f"expected lease generation {expected_lease_generation}, current {handle.lease_generation}",
                code="session_resume_conflict",
                session_id=session_id,
            )
        handle.lease_generation += 1
        self._state[session_id]["detached"] = False
        return handle

    async def detach_session(self, session_id: str, *, expected_lease_generation: int | None = None, timeout: float | None = 10.0) -> None:
        handle = self._require(session_id)
        if expected_lease_generation is not None and expected_lease_generation != handle.lease_generation:
            raise DuplexSessionError("stale lease", code="session_resume_conflict", session_id=session_id)
        self._state[session_id]["detached"] = True

    async def close_session(self, session_id: str, *, reason: str = "client_close", timeout: float | None = 10.0) -> None:
        from vllm_omni.engine.duplex.events import SessionClosed

        handle = self._handles.get(session_id)
        if handle is None or handle.closed:
            return
        handle._deliver(SessionClosed(session_id=session_id, reason=reason))
        await asyncio.wait_for(handle.wait_closed(), timeout)
        self._handles.pop(session_id, None)

    async def close_all_sessions(self, *, reason: str = "shutdown") -> None:
        for session_id in list(self._handles):
            await self.close_session(session_id, reason=reason)

    def expire(self, session_id: str, reason: str = "disconnect_grace_expired") -> None:
        """What the reaper does when a lease expires."""
        from vllm_omni.engine.duplex.events import SessionExpired

        handle = self._handles.pop(session_id)
        handle._deliver(SessionExpired(session_id=session_id, reason=reason))

    def _require(self, session_id: str) -> DuplexSessionHandle:
        handle = self._handles.get(session_id)
        if handle is None or handle.closed:
            raise DuplexSessionError(f"unknown duplex session {session_id}", code="unknown_session", session_id=session_id)
        return handle

    def _model_step(self, handle: DuplexSessionHandle, command: Any) -> None:
        from vllm_omni.engine.duplex import commands as c
        from vllm_omni.engine.duplex import events as e

        state = self._state[handle.session_id]
        sid = handle.session_id
        if isinstance(command, c.AppendAudio):
            assert command.format == "pcm_f32le" and command.sample_rate_hz == 16000, command
            state["input"].append(np.frombuffer(command.audio, dtype="<f4"))
        elif isinstance(command, c.Commit) and command.create_response:
            samples = np.concatenate(state["input"]) if state["input"] else np.zeros(0, dtype=np.float32)
            state["input"] = []
            pcm = (np.clip(soxr.resample(samples, 16000, 24000), -1, 1) * 32767).astype("<i2").tobytes()
            rid = f"resp-{sid}-{state['epoch']}-{uuid.uuid4().hex[:8]}"
            state["response"] = rid
            epoch = state["epoch"]
            handle._deliver(e.ResponseCreated(session_id=sid, epoch=epoch, response={"id": rid, "metadata": {"epoch": epoch}}, response_id=rid))
            handle._deliver(e.AudioDelta(session_id=sid, response_id=rid, item_id=f"item_{rid}", delta=_encode(pcm, state["format"]), format="pcm16" if state["format"] == "pcm" else "wav", sample_rate_hz=24000, metadata={"epoch": epoch}))
        elif isinstance(command, c.BargeIn):
            rid = state.get("response")
            epoch = state["epoch"]
            state["epoch"] += 1
            handle._deliver(e.ResponseDone(session_id=sid, response={"id": rid, "status": "cancelled", "status_details": {"reason": "barge_in"}}, response_id=rid))
            # 0.30.0: audio already in the outbox can still arrive after the cancel
            handle._deliver(e.AudioDelta(session_id=sid, response_id=rid, item_id=f"item_{rid}", delta=_encode(b"\x00\x00" * 480, "pcm"), sample_rate_hz=24000, metadata={"epoch": epoch}))
        elif isinstance(command, c.AckPlayback):
            handle._deliver(e.PlaybackAcknowledged(session_id=sid, details={"item_id": command.item_id, "played_ms": command.played_ms}))
        elif isinstance(command, c.Heartbeat):
            handle._deliver(e.SessionHeartbeatAck(session_id=sid))


def _encode(pcm: bytes, response_format: str) -> str:
    if response_format != "pcm":
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(24000)
            out.writeframes(pcm)
        pcm = buffer.getvalue()
    return base64.b64encode(pcm).decode()


def install() -> None:
    """Register this module as ``vllm_omni.entrypoints.duplex_omni``."""
    load_vllm_omni()
    module = types.ModuleType("vllm_omni.entrypoints.duplex_omni")
    module.DuplexOmni = DuplexOmni  # type: ignore[attr-defined]
    module.DuplexSessionHandle = DuplexSessionHandle  # type: ignore[attr-defined]
    sys.modules["vllm_omni.entrypoints.duplex_omni"] = module
