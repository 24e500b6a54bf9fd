"""Make the barge-in corpus's sounds (#41): speech in several synthetic voices, and the sounds of a caller's room.

    python bench/corpus/make_corpus.py       # needs espeak-ng (Debian: apt-get install espeak-ng)

Writes ``bench/corpus/*.wav`` (8 kHz PCM16 mono, committed: the benches and tests read them without espeak-ng):

- ``bc-<word>-<voice>.wav``: backchannels ("mm-hm" — spelt as phonemes, espeak-ng reads "mm-hm" out letter by letter —, "uh-huh", "yeah", "okay", "right") in five voices (espeak-ng's
  formant voices, two male, three female variants, pitch and rate varied), trimmed to the sound;
- ``say-<n>-<voice>.wav``: interruptions, a short sentence each ("Wait, that's not what I asked.");
- ``noise-cough.wav``, ``noise-click.wav``, ``noise-door.wav``, ``noise-keyboard.wav``: synthesised from seeded noise
  (a cough: two bursts of band-passed noise, 140 + 90 ms; a click: 6 ms; a door: a low thud, 350 ms decaying;
  typing: 12 key clicks over 1.4 s);
- ``room-voices.wav``: two other voices talking in the room (to be mixed well below the caller).

Speech is levelled to the bundled caller utterance's loud frames (its 90th percentile frame level), so a corpus
voice and the agent are as loud as each other on the line. Synthetic voices are not people: this widens the one
voice the benches had, it does not replace recordings of callers.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from callbridge.bridge.echo_gate import level_db  # noqa: E402
from callbridge.sim.runner import load_wav_8k, sample_caller_wav  # noqa: E402

HERE = Path(__file__).resolve().parent
RATE = 8000
VOICES = {"m3": ("en-us+m3", 165, 45), "f2": ("en-us+f2", 175, 60), "m1": ("en-gb+m1", 150, 35), "f4": ("en-us+f4", 185, 70),
          "f5": ("en-gb+f5", 160, 55)}  # fmt: skip
"""name: (espeak-ng voice, words a minute, pitch 0–99)."""
BACKCHANNELS = {"mmhm": "[[@m'h@m]]", "uhhuh": "uh-huh", "yeah": "yeah", "okay": "okay", "right": "right"}
SENTENCES = ("Wait, that's not what I asked.", "No, no, I need the Tuesday appointment.", "Hold on, can you say that again?")


def frames_db(pcm: np.ndarray) -> np.ndarray:
    usable = len(pcm) // 160 * 160
    return np.array([level_db(pcm[k : k + 160].tobytes()) for k in range(0, usable, 160)])


REFERENCE_DB = float(np.percentile(frames_db(np.frombuffer(load_wav_8k(sample_caller_wav()), dtype="<i2")), 90))


def spoken(text: str, voice: str) -> np.ndarray:
    espeak, rate, pitch = VOICES[voice]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "s.wav"
        subprocess.run(["espeak-ng", "-v", espeak, "-s", str(rate), "-p", str(pitch), "-w", str(out), text], check=True)
        with wave.open(str(out)) as w:
            samples = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64)
            rate_hz = w.getframerate()
    pcm = soxr.resample(samples, rate_hz, RATE)
    levels = frames_db(pcm.astype("<i2"))
    loud = np.nonzero(levels >= 45)[0]
    pcm = pcm[loud[0] * 160 : (loud[-1] + 1) * 160]  # the sound, no silence around it
    gain = 10 ** ((REFERENCE_DB - float(np.percentile(frames_db(pcm.astype("<i2")), 90))) / 20)
    return np.clip(pcm * gain, -32768, 32767).astype("<i2")


def band_noise(rng: np.random.Generator, ms: int, low_hz: float, high_hz: float) -> np.ndarray:
    n = ms * RATE // 1000
    spectrum = np.fft.rfft(rng.normal(0, 1, n))
    freqs = np.fft.rfftfreq(n, 1 / RATE)
    spectrum[(freqs < low_hz) | (freqs > high_hz)] = 0
    return np.fft.irfft(spectrum, n)


def levelled(pcm: np.ndarray, peak_db: float) -> np.ndarray:
    """``pcm`` scaled so its loudest 20 ms frame is ``peak_db`` (as ``level_db`` measures)."""
    levels = frames_db(pcm.astype("<i2"))
    return np.clip(pcm * 10 ** ((peak_db - levels.max()) / 20), -32768, 32767).astype("<i2")


def noises() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(41)
    burst = lambda ms, decay: band_noise(rng, ms, 300, 3000) * np.exp(-np.arange(ms * 8) / (decay * 8))  # noqa: E731
    cough = np.concatenate([burst(140, 60), np.zeros(400), burst(90, 40)])
    click = np.concatenate([rng.normal(0, 1, 48) * np.exp(-np.arange(48) / 10), np.zeros(112)])
    door = band_noise(rng, 350, 40, 400) * np.exp(-np.arange(2800) / 500)
    typing = np.zeros(11200)
    for at in np.sort(rng.integers(0, 11000, 12)):
        typing[at : at + 48] += rng.normal(0, 1, 48) * np.exp(-np.arange(48) / 8)
    return {"cough": levelled(cough, REFERENCE_DB + 3), "click": levelled(click, REFERENCE_DB), "door": levelled(door, REFERENCE_DB + 6),
            "keyboard": levelled(typing, REFERENCE_DB - 6)}  # fmt: skip


def write(name: str, pcm: np.ndarray, directory: Path = HERE) -> None:
    directory.mkdir(exist_ok=True)
    with wave.open(str(directory / f"{name}.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.astype("<i2").tobytes())


def main() -> None:
    for word, text in BACKCHANNELS.items():
        for voice in VOICES:
            write(f"bc-{word}-{voice}", spoken(text, voice))
    for n, text in enumerate(SENTENCES):
        for voice in VOICES:
            write(f"say-{n}-{voice}", spoken(text, voice))
    for name, pcm in noises().items():
        write(f"noise-{name}", pcm)
    room = np.concatenate([spoken("I think the meeting moved to three, did anyone tell Sam?", "m1"), np.zeros(2400, dtype="<i2"),
                           spoken("Can you pass me the charger, the blue one.", "f5")])  # fmt: skip
    write("room-voices", room)


if __name__ == "__main__":
    main()
