"""The public names of each package are pinned: a change here is an API change."""

from __future__ import annotations

import pytest

import callbridge
import callbridge.codecs
import callbridge.config

pytestmark = pytest.mark.core


def test_package() -> None:
    assert callbridge.__all__ == ["__version__"]


def test_codecs() -> None:
    assert sorted(callbridge.codecs.__all__) == sorted(
        [
            "FRAME_MS",
            "PCM16_SAMPLE_BYTES",
            "AudioEncoding",
            "Buffer",
            "FrameAssembler",
            "ResamplerQuality",
            "StreamResampler",
            "alaw_to_pcm16",
            "decode_to_pcm16",
            "encode_from_pcm16",
            "frame_bytes",
            "pcm16_rms",
            "pcm16_to_alaw",
            "pcm16_to_ulaw",
            "ulaw_to_pcm16",
        ]
    )
    for name in callbridge.codecs.__all__:
        assert hasattr(callbridge.codecs, name)


def test_config() -> None:
    for name in callbridge.config.__all__:
        assert hasattr(callbridge.config, name)
