"""The family kit's media helpers: decoding, stream checks, the input probes. Imports PyAV and numpy.

Engines import this in the pool child; a spec module imports it only inside its ``probe``
function, since every farm process (producers included) imports the specs. The light part of the
kit, :mod:`mediafarm.tasks.kit`, has the rest (``Span`` among it). Re-exports only.
"""

from __future__ import annotations

from mediafarm.tasks.media.decode import (
    BLOCK_SECONDS,
    SAMPLE_RATE,
    KeptAudio,
    audio_blocks,
    checked_audio_stream,
    checked_video_stream,
    declared_length,
    has_audio_stream,
    open_media,
    probe_duration,
    tolerant_frames,
)
from mediafarm.tasks.media.probe import probe_audio, probe_video
from mediafarm.tasks.media.streams import check_audio_stream, check_decodable

__all__ = [
    # Decoding: audio as 16 kHz mono float32 blocks, video frames past damaged packets.
    "BLOCK_SECONDS",
    "SAMPLE_RATE",
    "KeptAudio",
    "audio_blocks",
    "declared_length",
    "has_audio_stream",
    "open_media",
    "probe_duration",
    "tolerant_frames",
    # Checks: a stream FFmpeg can decode; a file's first packets, before a model loads (FamilySpec.probe).
    "check_audio_stream",
    "checked_audio_stream",
    "checked_video_stream",
    "check_decodable",
    "probe_audio",
    "probe_video",
]
