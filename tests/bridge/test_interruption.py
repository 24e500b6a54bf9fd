"""The bridge's interruption policy (``bridge/interruption.py``, #41): pause on speech over the agent, then confirm
a real interruption or resume after a backchannel, a cough or noise — from the caller's frames alone."""

from __future__ import annotations

import pytest

from callbridge.bridge.interruption import Confirm, InterruptionPolicy, InterruptionSettings, Pause, Resume, Verdict

pytestmark = pytest.mark.core

FRAME_MS = 32  # a Silero VAD frame at 16 kHz
DEFAULTS = InterruptionSettings()


def run(speech: list[tuple[int, int]], *, until_ms: int = 4000, audible_until_ms: int = 10_000,
        settings: InterruptionSettings | None = None) -> list[tuple[int, Verdict]]:  # fmt: skip
    """Feed frames from 0 to ``until_ms``; ``speech``: (start, end) ms of the caller's speech. Each verdict with the
    end of the frame that produced it. The agent stops being audible at a confirmation (as the driver does)."""
    policy = InterruptionPolicy(settings)
    verdicts: list[tuple[int, Verdict]] = []
    audible = True
    for at in range(0, until_ms, FRAME_MS):
        is_speech = any(start <= at < end for start, end in speech)
        verdict = policy.frame(at, FRAME_MS, speech=is_speech, agent_audible=audible and at < audible_until_ms)
        if verdict is not None:
            verdicts.append((at + FRAME_MS, verdict))
            audible = audible and not isinstance(verdict, Confirm)
    return verdicts


def test_a_click_or_a_short_cough_never_pauses_the_agent() -> None:
    assert run([(320, 352)]) == []  # one frame
    assert run([(320, 320 + (DEFAULTS.pause_after_ms - 1) // FRAME_MS * FRAME_MS)]) == []  # as many as are under the pause
    # three, 96 ms: under a pause of 100 ms (the default before session 37); at 80 it pauses, and resumes
    assert run([(320, 416)], settings=InterruptionSettings(pause_after_ms=100)) == []
    assert [type(v) for _, v in run([(320, 416)])] == [Pause, Resume]


@pytest.mark.parametrize(
    ("said_ms", "settings"),
    [(256, DEFAULTS), (416, DEFAULTS), (256, InterruptionSettings(resume_after_silence_ms=120)), (416, InterruptionSettings(resume_after_silence_ms=120))],
)
def test_a_backchannel_pauses_then_resumes_where_the_caller_stopped_hearing(said_ms: int, settings: InterruptionSettings) -> None:
    """An "mm-hm": resumed after ``resume_after_silence_ms`` of quiet; one as long as ``backchannel_max_ms`` or
    longer (300 ms) after ``gap_ms`` where that is longer (the caller may be between two words: "Wait, — that's
    not…"; at the defaults it is not)."""
    verdicts = run([(640, 640 + said_ms)], settings=settings)
    resume_after_ms = settings.resume_after_ms(said_ms)
    assert [type(v) for _, v in verdicts] == [Pause, Resume]
    (paused_at, pause), (resumed_at, resume) = verdicts
    assert isinstance(pause, Pause) and isinstance(resume, Resume)
    assert pause.onset_ms == 640 and paused_at - 640 <= settings.pause_after_ms + FRAME_MS
    assert resume.speech_ms == said_ms and resumed_at - (640 + said_ms) <= resume_after_ms + FRAME_MS
    assert resume.paused_ms == resumed_at - paused_at


def test_a_real_interruption_pauses_at_once_and_is_confirmed_from_its_onset() -> None:
    verdicts = run([(640, 2000)])
    assert [type(v) for _, v in verdicts] == [Pause, Confirm]
    (paused_at, _), (confirmed_at, confirm) = verdicts
    assert isinstance(confirm, Confirm) and confirm.onset_ms == 640  # its words go to the engine from here
    assert paused_at - 640 <= 100 + FRAME_MS and confirmed_at - 640 <= 600 + FRAME_MS


def test_speech_with_short_gaps_between_syllables_is_one_run() -> None:
    syllables = [(640, 800), (864, 1000), (1064, 1300)]  # gaps of 64 ms
    verdicts = run(syllables)
    assert [type(v) for _, v in verdicts] == [Pause, Confirm]
    assert verdicts[-1][1] == Confirm(640)


def test_sound_while_the_agent_is_silent_is_no_interruption() -> None:
    assert run([(640, 2000)], audible_until_ms=0) == []


def test_in_a_pause_speech_with_short_gaps_goes_on_from_the_pauses_onset() -> None:
    """Bursts of 96 ms with 96 ms between (gaps over ``gap_ms``, under ``resume_after_silence_ms``): outside a pause
    each would be a run of its own; in one, the caller is taken to be still talking — confirmed from the first
    burst's onset once that has lasted ``confirm_after_ms``."""
    bursts = [(640 + i * 192, 640 + i * 192 + 96) for i in range(30)]
    settings = InterruptionSettings(pause_after_ms=64, gap_ms=60, resume_after_silence_ms=200)
    verdicts = run(bursts, until_ms=8000, settings=settings)
    assert [type(v) for _, v in verdicts][:2] == [Pause, Confirm], verdicts
    (paused_at, _), (confirmed_at, confirm) = verdicts[:2]
    assert confirm == Confirm(640) and confirmed_at - 640 <= 600 + 192


def test_in_a_pause_a_sound_the_echo_could_explain_holds_the_resume_until_the_line_is_quiet() -> None:
    """The caller stops being told apart from the echo's tail (their speech goes on under it): not quiet, so no
    resume — the agent would talk over them; quiet for ``resume_after_silence_ms`` after it, the reply resumes."""
    policy = InterruptionPolicy()
    verdicts: list[tuple[int, Verdict]] = []
    for at in range(0, 2000, FRAME_MS):
        speech, quiet = 640 <= at < 900, not 640 <= at < 1400  # speech, then 500 ms of sound echo could explain
        verdict = policy.frame(at, FRAME_MS, speech=speech, agent_audible=True, quiet=quiet)
        if verdict is not None:
            verdicts.append((at + FRAME_MS, verdict))
    assert [type(v) for _, v in verdicts] == [Pause, Resume]
    assert verdicts[1][0] >= 1400 + 120  # not 120 ms after the last frame told apart from the echo (900)


def test_speech_soon_after_a_resume_goes_on_from_what_paused_the_agent() -> None:
    """"No, — no, I need Tuesday": the first word pauses the agent and its end resumes it (a backchannel's length);
    the caller going on within ``_REJOIN_MS`` pauses it again at once, and the barge-in is confirmed with the words
    sent from the first word's onset."""
    verdicts = run([(640, 928), (1184, 2400)])
    assert [type(v) for _, v in verdicts] == [Pause, Resume, Pause, Confirm], verdicts
    (_, _), (resumed_at, _), (paused_again_at, _), (confirmed_at, confirm) = verdicts
    assert paused_again_at == 1184 + FRAME_MS  # its first frame
    assert confirm == Confirm(640) and confirmed_at <= 1184 + 600


def test_a_second_backchannel_after_a_resume_is_judged_on_its_own() -> None:
    verdicts = run([(640, 1056), (2000, 2400)])
    assert [type(v) for _, v in verdicts] == [Pause, Resume, Pause, Resume]
    assert [v.onset_ms for _, v in verdicts if isinstance(v, Pause)] == [640, 2016]  # the first frame of each


def test_the_agent_stopping_by_itself_ends_a_pause() -> None:
    policy = InterruptionPolicy()
    verdicts = [policy.frame(at, FRAME_MS, speech=True, agent_audible=True) for at in range(0, 192, FRAME_MS)]
    assert any(isinstance(v, Pause) for v in verdicts) and policy.paused
    policy.agent_stopped()
    assert not policy.paused


@pytest.mark.parametrize("bad", [{"pause_after_ms": 0}, {"pause_after_ms": 700}, {"gap_ms": 0}, {"max_pause_ms": 100}])
def test_settings_that_cannot_work_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        InterruptionSettings(**bad)
