"""espeak-ng as a TTS voice: the rung that is always there (no model; ~8 MB).

Two ways to the same engine. By default libespeak-ng and its voice data from the
``espeakng-loader`` wheel of the tts extra, in process (:mod:`.libespeak`): ``pip install
'mediafarm[tts]'`` alone speaks on any machine, the same samples on every host whatever else is
installed there, and with no process to start for each chunk (a sentence: about 8 ms in the library,
loading included, against 11 ms for the program; docs/benchmarks/tts.md). Or a program the rung names
(``params.binary``: Debian's ``espeak-ng``, an operator's wrapper), where it is on PATH. Both take
the same voice names and flags and their audio goes through the same checks.

For the program, the text goes on stdin (never on the command line, where a leading ``-`` would read as an
option). A process costs ~13 ms to start (a fresh library ~3 ms), which for a 100,000-character
text (2,000 sentences) would be most of the job; so a chunk's pieces go to one call as SSML, separated by a
``BREAK`` of silence, and the waveform is cut back into pieces at the runs of exact zeros that
long (espeak-ng's own pauses are shorter and never quite zero for that long). Should the count
of such runs not match the pieces, each piece is spoken on its own instead: times stay exact.
"""

from __future__ import annotations

import functools
import io
import shutil
import subprocess
from collections.abc import Sequence
from xml.sax.saxutils import escape

import numpy as np
import soundfile as sf

from mediafarm.tasks.families.tts.libespeak import library
from mediafarm.tasks.kit import RungUnavailable

# espeak-ng's own default pace, words a minute.
WORDS_PER_MINUTE = 175
# espeak-ng's output rate, whatever the voice.
RATE = 22050
# Silence put between a chunk's pieces, and the shortest run of zeros taken for one.
BREAK_MS = 1500
CUT_SECONDS = 1.2
# A piece is at most a few hundred characters: seconds at most, even on a loaded machine.
TIMEOUT = 60.0


def find_espeak(binary: str | None) -> str | None:
    """The path of the espeak-ng program a rung names; None where it names none or the name is not on
    PATH (the wheel's library speaks)."""
    return shutil.which(binary) if binary else None


@functools.lru_cache(maxsize=4)
def _version(binary: str) -> str:
    """espeak-ng's name and version (``eSpeak NG text-to-speech: 1.51 ...`` up to the colon), asked
    once per child: a process start for it cost every job a good share of a short sentence's
    whole job (measured: docs/benchmarks/tts.md)."""
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=TIMEOUT)
    return done.stdout.split(":")[0].strip() or "espeak-ng"


class EspeakVoice:
    """One espeak-ng voice (``en-us+m3``) at one pace, by the wheel's library or the program named.

    Attributes: program (the executable's path, None when the library speaks), voice, wpm, label
    (engine, version and voice: a checkpoint made by one is never resumed by the other), rate."""

    def __init__(self, binary: str | None, voice: str, speed: float) -> None:
        self.program, self.voice = find_espeak(binary), voice
        self.wpm = int(round(WORDS_PER_MINUTE * speed))
        if self.program is not None:
            self.label = f"{_version(self.program)} {voice}"
        else:
            self.label = f"libespeak-ng {library().version} {voice}"
        self.rate = RATE

    def speak(self, texts: Sequence[str]) -> list[np.ndarray]:
        if len(texts) > 1:
            ssml = f'<break time="{BREAK_MS}ms"/>'.join(escape(t) for t in texts)
            pieces = _cut_at_breaks(self._synth(f"<speak>{ssml}</speak>", ssml=True), len(texts))
            if pieces is not None:
                return pieces
        return [self._synth(text) for text in texts]

    def _synth(self, text: str, ssml: bool = False) -> np.ndarray:
        if self.program is None:
            wanted = library()
            samples, rate = wanted.synth(text, self.voice, self.wpm, ssml=ssml), wanted.rate
            # As libsndfile reads the program's 16-bit WAV as float32.
            audio = samples.astype(np.float32) / np.float32(32768.0)
        else:
            audio, rate = self._run(text, ssml)
        if audio.size == 0:  # as the program exits without a sample for a text of only punctuation
            raise RuntimeError(f"espeak-ng spoke no audio for {len(text)} characters in voice {self.voice!r}")
        if rate != self.rate:
            raise RuntimeError(f"espeak-ng spoke at {rate} Hz, not {self.rate}")
        return audio

    def _run(self, text: str, ssml: bool) -> tuple[np.ndarray, int]:
        done = subprocess.run(
            [self.program, *(["-m"] if ssml else []), "-v", self.voice, "-s", str(self.wpm), "--stdin", "--stdout"],
            input=text.encode("utf-8"), capture_output=True, timeout=TIMEOUT, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not done.stdout:
            message = done.stderr.decode(errors="replace").strip()[:300]
            if "voice" in message.lower():
                raise RungUnavailable(f"espeak-ng has no voice {self.voice!r}: {message}")
            raise RuntimeError(f"espeak-ng failed (exit {done.returncode}): {message}")
        # espeak-ng writes a streaming WAV header (sizes 0x7fffffff); libsndfile reads it anyway.
        audio, rate = sf.read(io.BytesIO(done.stdout), dtype="float32")
        return audio.reshape(-1), rate


def _cut_at_breaks(audio: np.ndarray, count: int) -> list[np.ndarray] | None:
    """``audio`` cut at its inner runs of >= CUT_SECONDS of exact zeros into ``count`` pieces, or
    None when there are not exactly ``count - 1`` such runs."""
    silent = np.concatenate([[0], (audio == 0).astype(np.int8), [0]])
    edges = np.diff(silent)
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    # In numpy: speech has a zero run at nearly every other crossing, thousands a chunk, and a
    # Python loop over them was a fifth of the rung's own time on a long text (issue #34).
    keep = (ends - starts >= CUT_SECONDS * RATE) & (starts > 0) & (ends < audio.size)
    long = list(zip(starts[keep].tolist(), ends[keep].tolist(), strict=True))
    if len(long) != count - 1:
        return None
    bounds = [0, *(x for run in long for x in run), audio.size]
    return [audio[bounds[i] : bounds[i + 1]] for i in range(0, len(bounds), 2)]
