"""The TTS family: speech from text with fixed named speakers (ChatTTS → Piper → espeak-ng)."""

from mediafarm.tasks.families.tts.spec import FAMILY

__all__ = ["FAMILY"]
