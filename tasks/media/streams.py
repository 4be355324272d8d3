"""A stream's declared parameters that FFmpeg opens without complaint but no decode can use, checked
before the first packet, so the file is refused naming what is wrong with it.

Found by the malformed-input battery (``tests/integration/test_malformed_battery.py``), each of which
had failed the job as an engine error with PyAV's own exception:

- a codec FFmpeg has no decoder for (an unknown WAVE format tag, an AVI FourCC nobody registered):
  PyAV gives the stream no codec context, and the first decode raises ``DecoderNotFoundError``;
- an audio stream with no channels: ``avcodec_open2`` fails with EINVAL at the first decode;
- a sample rate no recording has. 1 Hz is read as 16,000 times as many samples at 16 kHz (one
  second of data became 4.4 hours of decoded silence), 2 GHz as none at all.
"""

from __future__ import annotations

import av

from mediafarm.tasks.wire.errors import UnreadableMedia

# Sample rates audio is read at: from below the 8 kHz of telephony to above the 768 kHz that the
# fastest converters sold record at (DSD decodes to 352.8 kHz).
MIN_AUDIO_RATE, MAX_AUDIO_RATE = 1_000, 1_000_000


def check_decodable(stream: av.stream.Stream, name: str) -> None:
    """UnreadableMedia when FFmpeg has no decoder for ``stream``'s codec (``name``: the file's)."""
    if stream.codec_context is None:
        raise UnreadableMedia(
            f"{name}: the {stream.type} stream's codec has no decoder in this FFmpeg (an unknown or unsupported codec)"
        )


def check_audio_stream(stream: av.stream.Stream, name: str) -> None:
    """UnreadableMedia when ``stream`` cannot be decoded or declares channels or a rate no audio has."""
    check_decodable(stream, name)
    context = stream.codec_context
    if context.channels < 1:
        raise UnreadableMedia(f"{name}: the audio stream declares no channels")
    if not MIN_AUDIO_RATE <= context.sample_rate <= MAX_AUDIO_RATE:
        raise UnreadableMedia(
            f"{name}: the audio stream declares a sample rate of {context.sample_rate:,} Hz; audio is read at "
            f"{MIN_AUDIO_RATE:,} to {MAX_AUDIO_RATE:,} Hz"
        )
