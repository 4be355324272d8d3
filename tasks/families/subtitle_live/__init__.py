"""The live subtitle family: subtitles of a stream as it plays (VAD, recognition, chunked WebVTT).

What the family offers outside a worker (the gateway's live WebSocket uses it): the request model
and the push stream a producer writes audio into (``push.AudioPush``).
"""

from mediafarm.tasks.families.subtitle_live.push import MAX_AHEAD_SECONDS, AudioPush, PushFormatError
from mediafarm.tasks.families.subtitle_live.spec import FAMILY, LiveSubtitleRequest

__all__ = ["FAMILY", "MAX_AHEAD_SECONDS", "AudioPush", "LiveSubtitleRequest", "PushFormatError"]
