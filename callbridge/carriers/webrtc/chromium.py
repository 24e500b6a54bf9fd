"""Chromium, headless, as the caller of a ``/talk`` call, for tests and benches: Debian's ``chromium`` driven by
Selenium through ``chromium-driver`` (the test extra), its microphone a WAV file played by Chromium's fake capture
device, its media prompts accepted. Blocking, as Selenium is: run it in a thread beside an event loop."""

from __future__ import annotations

import shutil
import wave
from pathlib import Path
from typing import Any, Final

from callbridge.codecs import ResamplerQuality, StreamResampler

__all__ = ["fake_microphone", "start_chromium"]

_CAPTURE_HZ: Final = 48_000


def fake_microphone(pcm_8k: bytes, path: Path) -> Path:
    """``pcm_8k`` (PCM16 mono 8 kHz) written to ``path`` as Chromium's fake capture takes it: 48 kHz mono WAV."""
    resampler = StreamResampler(8000, _CAPTURE_HZ, ResamplerQuality.HQ)
    pcm = resampler.process(pcm_8k) + resampler.flush()
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(_CAPTURE_HZ)
        out.writeframes(pcm)
    return path


def start_chromium(microphone: Path, *, binary: str | None = None, driver: str | None = None) -> Any:
    """A headless Chromium whose microphone plays ``microphone`` once (then silence); ``binary`` and ``driver``: the
    browser's and chromedriver's paths (found on ``PATH`` where not given). The Selenium WebDriver."""
    from selenium import webdriver  # noqa: PLC0415  # the test extra's, for tests and benches only

    options = webdriver.ChromeOptions()
    options.binary_location = binary or shutil.which("chromium") or "chromium"
    for argument in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={microphone}%noloop",
        "--autoplay-policy=no-user-gesture-required",
    ):  # fmt: skip
        options.add_argument(argument)
    service = webdriver.ChromeService(executable_path=driver or shutil.which("chromedriver"))
    return webdriver.Chrome(options=options, service=service)
