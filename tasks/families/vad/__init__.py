"""The VAD family: speech spans of an audio or video file (silero-vad → webrtcvad → skip)."""

from mediafarm.tasks.families.vad.spec import FAMILY

__all__ = ["FAMILY"]
