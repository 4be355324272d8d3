"""The cheap look at an input file that a media family takes before its engine loads a model.

A cold pool child imports its engine's packages and loads a model on its first job: seconds of
work (4-6 s for silero or Whisper, found from outside) before a malformed file could be refused.
A family's ``FamilySpec.probe`` runs these checks first, so a bad file is refused at once, and
the engine's own streaming decode keeps every check that needs the whole file (truncation against
a declared length, non-finite samples, undecodable runs later on).

What is looked at, from the header and the first packets only:

- the file opens as media FFmpeg reads;
- the stream the family needs is there (``UnreadableMedia`` naming the file when it is not);
- the stream can be decoded: a codec with a decoder, channels and a rate audio has
  (``media.streams``), a frame size for video;
- a WAV's header does not declare more audio than the file holds (``media.wav``);
- its first packets decode to a frame (a file whose start is garbage).

A stream with no packets at all passes: an empty recording is valid input, answered as such by the
engine.
"""

from __future__ import annotations

from pathlib import Path

import av

from mediafarm.tasks.media.decode import checked_audio_stream, checked_video_stream, open_media, tolerant_frames


def probe_audio(path: Path, *, require_audio: bool = True) -> None:
    """UnreadableMedia unless ``path``'s first audio stream looks decodable from its first packets.

    ``require_audio=False``: a file without an audio stream passes (the VAD's ``if_no_audio="empty"``).
    """
    with open_media(path) as container:
        if not container.streams.audio and not require_audio:
            return
        stream = checked_audio_stream(container, path)
        _first_frame(container, stream, f"{path.name}: audio stream")


def probe_video(path: Path) -> None:
    """UnreadableMedia unless ``path``'s first video stream looks decodable from its first packets."""
    with open_media(path) as container:
        stream = checked_video_stream(container, path)
        _first_frame(container, stream, f"{path.name}: video stream")


def _first_frame(container: av.container.InputContainer, stream: av.stream.Stream, label: str) -> None:
    # The engine's own frame loop, stopped at its first frame: corrupt packets are skipped as the
    # engine would skip them, and a start the engine would give up on is refused here.
    for _ in tolerant_frames(container, stream, label):
        return
