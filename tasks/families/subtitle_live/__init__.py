"""The live subtitle family: subtitles of a stream as it plays (VAD, recognition, chunked WebVTT)."""

from mediafarm.tasks.families.subtitle_live.spec import FAMILY

__all__ = ["FAMILY"]
