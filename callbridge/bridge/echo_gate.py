"""Whether the caller's audio holds more than the agent's own voice coming back (#41), sans-I/O: the echo gate.

On a speakerphone, or a PBX that cancels no echo, the agent's voice returns on the caller's line some 0–500 ms
later and 6–30 dB down; a VAD takes it for the caller, and the agent stops for itself. The bridge knows what the
caller heard, frame by frame (the far end). The gate compares each frame the line sends (the near end) with that:

- **the echo path**, per call: the delay is the lag (0 to ``max_delay_ms``, in frames) at which the near end's
  energy envelope follows the far end's best (Pearson correlation of the frames' dB levels, over the last
  ``window_ms`` in which the agent was heard, at least ``trust_correlation``); the echo's loss is the median of far
  minus near at that lag. Both are learnt only from frames the gate took for echo, and not from those within
  100 ms of one it took for the caller's: a caller over the echo is taken for theirs at their loud peaks only, and
  their quieter syllables around them would teach the gate a smaller loss — and then it would hear them less;
- **each frame**: echo can explain the near end's level if it is at most the loudest far-end frame around the delay
  (one frame either side) less the loss, plus a margin (once the path is learnt, what this line's echo strays above
  that bound, ``least_margin_db`` to ``margin_db``). A frame above that holds the caller's own sound (double talk
  included): ``near`` says True. Until the path is known, the delay is taken as any lag and the loss as the least
  the issue allows for (``assumed_loss_db``, 6 dB) — or, once the line has been heard against 0.7 s of the agent,
  what its loud end stays below the loudest the caller heard in the range (a line with no echo learns this, never a
  path), with ``unlearnt_margin_db``; where the agent was not heard within ``max_delay_ms``, nothing can be echo.

Why energy envelopes and not an echo canceller: the bridge must only tell *whether* the caller spoke, not give
the engine a clean signal (the engine hears the caller's audio as sent, and during the agent's speech only
after a confirmed barge-in). WebRTC's AEC3 (``pywebrtc-audio``, measured in ``bench/RESULTS.md``, session 34)
cancels well but costs 5 CPU-ms per call-second and takes a double-talking caller down by up to 50 dB; this costs
a few microseconds a frame and leaves the caller's level as it is. What it cannot do: tell the caller from an echo
much louder than the path it learnt (a changing path re-learns within ``window_ms``), or from the agent's voice
played in the caller's room by another device.

Used by bridge-mode barge-in (``bridge/interruption_judge.py``, ``bridge/bridge_barge_in.py``).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections import deque
from dataclasses import dataclass

import numpy as np

with warnings.catch_warnings():  # deprecated in 3.11/3.12 (PEP 594), restored by audioop-lts on 3.13+ (as codecs.g711)
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

__all__ = ["EchoGate", "EchoGateSettings", "level_db"]

_LEARNT_FROM_FRAMES = 35
"""The echo path is learnt from at least this many far-end frames of the agent heard, each with its near-end frame
(0.7 s at 20 ms): fewer let a chance likeness of two envelopes pass for the path."""
_LINE_HEARD_FROM_FRAMES = 10
"""The loss with no path (90th percentiles of the line's level) is learnt once at every lag this many near-end frames
(0.2 s) had the agent heard that long before them."""
_DOUBLE_TALK_REACH = 5
"""Frames either side of one the gate took for the caller's that are not learnt from (100 ms at 20 ms)."""
_DOUBLE_TALK_KERNEL = np.ones(2 * _DOUBLE_TALK_REACH + 1)
_STRAY_ALLOWANCE_DB = 1.0
"""Added to how far the echo strayed above the path's bound (its 95th percentile) for the margin."""


def level_db(pcm: bytes) -> float:
    """A PCM16 frame's level: 20·log10 of its RMS (int16 units; silence 0, speech about 60–75)."""
    return 20 * math.log10(audioop.rms(pcm, 2) + 1) if pcm else 0.0


@dataclass(frozen=True, slots=True)
class EchoGateSettings:
    frame_ms: int = 20
    max_delay_ms: int = 500
    """The longest echo path looked for."""
    window_ms: int = 3000
    """How much of the call the path is learnt from (the agent heard in it)."""
    estimate_every_ms: int = 400
    """How often the path is re-learnt until it is known; then every ``estimate_known_every_ms``."""
    estimate_known_every_ms: int = 1000
    far_active_db: float = 40.0
    """A far-end frame at least this loud is the agent speaking (speech is about 60–75)."""
    margin_db: float = 6.0
    """How far above what echo explains a near-end frame must be to be the caller's, once the path is learnt (the
    most: what the line's echo strays above its bound, ``least_margin_db`` at the least)."""
    least_margin_db: float = 4.0
    unlearnt_margin_db: float = 3.0
    """The margin until the path is learnt: the bound then is already the loudest frame at any lag less the least
    loss, which is above what any one echo frame reaches."""
    assumed_loss_db: float = 6.0
    """The echo's loss taken until the path is learnt: the least an echo is down (the loudest echo looked for)."""
    trust_correlation: float = 0.6


class EchoGate:
    """One call's echo gate (see the module docstring). Feed ``far`` each frame the caller heard (silence included,
    on the call's frame clock) and ``near`` each frame its line sent, in step."""

    def __init__(self, settings: EchoGateSettings | None = None) -> None:
        self.settings = settings or EchoGateSettings()
        s = self.settings
        self._max_lag = s.max_delay_ms // s.frame_ms
        self._window = s.window_ms // s.frame_ms
        self._estimate_every = max(1, s.estimate_every_ms // s.frame_ms)
        self._estimate_known_every = max(1, s.estimate_known_every_ms // s.frame_ms)
        self._far: deque[float] = deque(maxlen=self._window + self._max_lag + 2)
        self._near: deque[float] = deque(maxlen=self._window)
        self._theirs: deque[bool] = deque(maxlen=self._window)
        """Per near-end frame in the window: whether the gate took it for the caller's."""
        self._since_estimate = 0
        self.delay_frames: int | None = None
        """The echo path's delay (frames), once learnt."""
        self.loss_db: float | None = None
        """How far down the echo is (dB), once learnt."""
        self.margin_db = self.settings.unlearnt_margin_db
        """How far above the echo's bound a frame must be to be the caller's: ``unlearnt_margin_db`` until the path
        is learnt, then what the line's echo strays above it (``least_margin_db`` to ``margin_db``)."""
        self._line_heard = False
        """Whether the loss with no path has been learnt (``_LINE_HEARD_FROM_FRAMES``)."""
        self._loss_any_lag_db = 0.0
        """Until the path is learnt: how far the line's level stays below the loudest the caller heard in the last
        ``max_delay_ms`` (a line with no echo at all learns this, never a path)."""
        self._rows: np.ndarray | None = None
        """``_lag_rows``' last indices."""
        self.slack_frames = 0
        """Frames either side of the path's delay the bound spans beyond the one it always does: set by the caller
        while what it fed as ``far`` may be that far off what the caller heard (``unsure``)."""

    def _lag_rows(self, count: int) -> np.ndarray:
        """Indices into the newest ``count + max_lag`` far-end frames: row L, the frames L before each of the newest
        ``count`` near-end frames (made once for each count: the window's, once full)."""
        rows = self._rows
        if rows is None or rows.shape[1] != count:
            rows = self._rows = (self._max_lag - np.arange(self._max_lag + 1))[:, None] + np.arange(count)
        return rows

    @property
    def delay_ms(self) -> int | None:
        return None if self.delay_frames is None else self.delay_frames * self.settings.frame_ms

    def unsure(self, off_ms: int) -> None:
        """The far end fed lately may be up to ``off_ms`` off when the caller heard it (the playout model moved by
        that much on the carrier's word): the bound spans as many more frames either side of the delay (0: none)."""
        self.slack_frames = (off_ms + self.settings.frame_ms // 2) // self.settings.frame_ms

    def far(self, pcm: bytes) -> None:
        """The next frame of what the caller heard (the agent, or silence)."""
        self._far.append(level_db(pcm))

    def far_level(self, db: float) -> None:
        """The next frame of what the caller heard, by its level (``level_db``)."""
        self._far.append(db)

    def idle(self) -> None:
        """A frame in step on both sides where the agent was not heard, nor can echo (a caller's, or nobody's):
        kept as silence so the lags line up, nothing judged or learnt (no work while the agent is quiet)."""
        self._far.append(0.0)
        self._near.append(0.0)
        self._theirs.append(True)

    def near(self, pcm: bytes) -> bool:
        """The next frame the caller's line sent: True where it holds more than the agent's echo can explain."""
        return self.near_level(level_db(pcm))

    def near_level(self, near_db: float) -> bool:
        """The next frame the caller's line sent, by its level (``level_db``): as ``near``."""
        theirs = near_db > self._echo_bound_db() + self.margin_db
        self._near.append(near_db)
        self._theirs.append(theirs)
        self._since_estimate += 1
        if self._line_heard:
            every = self._estimate_every if self.delay_frames is None else self._estimate_known_every
        else:  # nothing known of the line yet: every frame judged on the loudest echo looked for, so learn sooner
            every = max(1, self._estimate_every // 2)
        if self._since_estimate >= every:
            self._since_estimate = 0
            self._learn()
        return theirs

    def _echo_bound_db(self) -> float:
        """The loudest the echo can be in the near-end frame in step with the newest far-end one."""
        far = self._far
        if not far:
            return 0.0
        if self.delay_frames is None or self.loss_db is None:
            nearest, farthest, loss = 0, self._max_lag, max(self.settings.assumed_loss_db, self._loss_any_lag_db)
        else:
            reach = 1 + self.slack_frames
            nearest, farthest, loss = max(0, self.delay_frames - reach), self.delay_frames + reach, self.loss_db
        # the far-end frames ``nearest`` to ``farthest`` frames before the newest (those there are), read from the end
        return max(itertools.islice(reversed(far), nearest, farthest + 1), default=0.0) - loss

    def _learn(self) -> None:
        """Re-estimate the echo path from the window: far-end frames where the agent was heard, paired with the
        near-end frames the gate took for echo (the caller's own frames would teach it the caller, not the path).
        Kept as it was where the window says too little. All lags at once, as one array; the sums of all lags in
        one reduction (a few numpy calls in all: each costs more than its arithmetic at these sizes)."""
        count = min(len(self._near), len(self._far) - self._max_lag)  # the newest near-end frames with every lag behind
        if count < self._estimate_every:
            return
        settings = self.settings
        near = np.fromiter(self._near, dtype=np.float64)[-count:]
        theirs = np.fromiter(self._theirs, dtype=bool)[-count:]
        # the caller's frames and their neighbours: a caller over the echo is taken for theirs only at their loud
        # peaks, and the frames around them (their quieter syllables) would teach the gate the caller, not the path
        echo_only = np.convolve(theirs, _DOUBLE_TALK_KERNEL, mode="same") == 0
        far_all = np.fromiter(self._far, dtype=np.float64)[-(count + self._max_lag) :]
        far = far_all[self._lag_rows(count)]  # row L: the far-end frames L earlier than each near-end frame
        used = (far >= settings.far_active_db) & echo_only
        n = used.sum(axis=1)
        terms = np.empty((5, *far.shape))  # x, y, x², y², xy: the far and near ends where used, 0 elsewhere
        x, y = np.multiply(far, used, out=terms[0]), np.multiply(near, used, out=terms[1])
        np.multiply(x, x, out=terms[2])
        np.multiply(y, y, out=terms[3])
        np.multiply(x, y, out=terms[4])
        sx, sy, sxx, syy, sxy = terms.sum(axis=2)
        spread = (n * sxx - sx * sx) * (n * syy - sy * sy)
        # the line's loss, path or none: how far its loud end stays below the agent's typical level — at each lag, the
        # 90th percentile of the near end where the agent was heard that long before, and the loudest of those (the
        # echo's own lag among them: where its source was silent, after a pause or a reply's start, is not counted).
        # A line with no echo learns it has little to fear, a line with one about its loss; learnt once every lag
        # has been heard enough
        if (n >= _LINE_HEARD_FROM_FRAMES).all():
            self._line_heard = True
            loudest = far.max(axis=0)  # the bound's own reference: the loudest the caller heard in the range
            heard = np.sort(loudest[loudest >= settings.far_active_db])
            typical = float((heard[(len(heard) - 1) // 2] + heard[len(heard) // 2]) / 2)  # the median, as np.median
            # each lag's 90th percentile (the used frames sort last; a sort costs microseconds where nanpercentile
            # costs half a millisecond)
            ordered = np.sort(np.where(used, near, -np.inf), axis=1)
            at_90th = count - n + (0.9 * (n - 1)).astype(np.int64)
            self._loss_any_lag_db = typical - float(ordered[np.arange(len(n)), at_90th].max())
        # the best lag of those heard for a while, taken once it has been heard enough: early in a reply the longer
        # lags have had fewer of the agent's frames (theirs fall before it began), and a chance likeness at a short
        # lag, heard enough, would pass for the path while the true one, longer, is still being heard
        compared = (n >= _LINE_HEARD_FROM_FRAMES) & (spread > 0)
        if not compared.any():
            return
        correlation = np.where(compared, (n * sxy - sx * sy) / np.sqrt(np.where(compared, spread, 1.0)), -1.0)
        lag = int(np.argmax(correlation))
        if n[lag] < _LEARNT_FROM_FRAMES or correlation[lag] < settings.trust_correlation:
            return
        self.delay_frames = lag
        self.loss_db = float(np.median(far[lag][used[lag]] - near[used[lag]]))
        # how far this line's echo strays above the path's bound: the margin a caller's frame must clear, down to
        # ``least_margin_db`` on a clean line (a caller heard sooner over the echo), never above ``margin_db``
        bound = far[max(0, lag - 1) : lag + 2].max(axis=0)[used[lag]] - self.loss_db
        stray = float(np.percentile(near[used[lag]] - bound, 95))
        self.margin_db = min(settings.margin_db, max(settings.least_margin_db, stray + _STRAY_ALLOWANCE_DB))
