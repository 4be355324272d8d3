"""The dialogue family: a script's lines spoken by TTS jobs in parallel, assembled in order with subtitles."""

from mediafarm.tasks.families.dialogue.spec import FAMILY

__all__ = ["FAMILY"]
