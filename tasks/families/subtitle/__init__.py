"""The subtitle family: WebVTT/SRT/JSON of speech, VAD first (faster-whisper → pocketsphinx)."""

from mediafarm.tasks.families.subtitle.spec import FAMILY

__all__ = ["FAMILY"]
