"""The TTS family: speech from text with fixed named speakers (ChatTTS → Piper → espeak-ng).

What the family offers outside a worker (the gateway's speech route and rooms use it): the request
model, the speaker store and the encoder that turns the chunks' PCM into a stream's format. The
encoder needs PyAV and numpy, so it is imported when first asked for, not with the family.
"""

from typing import Any

from mediafarm.tasks.families.tts.speakers import get_speaker
from mediafarm.tasks.families.tts.spec import FAMILY, TtsRequest

__all__ = ["FAMILY", "Encoder", "TtsRequest", "get_speaker"]


def __getattr__(name: str) -> Any:
    if name == "Encoder":
        from mediafarm.tasks.families.tts.audio import Encoder

        return Encoder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
