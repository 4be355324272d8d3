"""Text for speech: what a job may ask to be read, and how it is cut for the engines.

A text is checked once, where the request is parsed (producer and worker alike), so a bad one is
rejected before anything runs and is never retried. It is then split at sentence boundaries
(``split_sentences``), and sentences are packed in order into chunks of at most ``max_chars``
characters (``plan_chunks``), one engine call each: ChatTTS speaks about 30 s per call at most, and
a chunk is also the unit a client can play before the job ends. The first chunk holds the first
sentence alone, so the first audio comes after one sentence's synthesis, not one chunk's. A
sentence longer than a chunk is cut at clause marks, then between words, into pieces that stay
one sentence in the result.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# ~100 kB of prose is ~16,000 words, ~95 minutes of speech: a book chapter. Longer texts are a
# batch of jobs; one job holds its audio file and its attempt for that long.
MAX_TEXT_CHARS = 100_000
# Whitespace a text may hold; every other control character is refused.
_ALLOWED_CONTROLS = frozenset("\n\r\t")
# A sentence ends at . ! ? … followed by closing quotes/brackets and a space, at the CJK marks
# 。！？ followed by closing marks with or without a space (Chinese and Japanese put none between
# sentences), or at a blank line. Short abbreviations ("Dr.", "e.g.") are not ends.
_END = re.compile(r"""(?<=[.!?…])["'”’)\]]*\s+|(?<=[。！？])["'”’」』）)\]]*\s*|\n\s*\n""")
_ABBREVIATION = re.compile(r"(?:^|[\s(])(?:Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|Mt|vs|etc|e\.g|i\.e|No|[A-Z])\.$")
_CLAUSE = re.compile(r"(?<=[,;:—–])\s+|(?<=[，；：、])\s*")


def check_text(text: str) -> str:
    """``text`` if it can be spoken, else ValueError naming the problem (pydantic makes it the
    ``text`` field's error, an InvalidRequest)."""
    if not isinstance(text, str):
        raise ValueError(f"must be a string, got {type(text).__name__}")
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"is {len(text):,} characters; the maximum is {MAX_TEXT_CHARS:,} (split it into several jobs)")
    if not text.strip():
        raise ValueError("is empty or only whitespace; there is nothing to say")
    if all(char.isspace() or unicodedata.category(char).startswith("P") for char in text):
        # Every engine speaks nothing for it (Piper's chunk then has no audio to write; espeak-ng
        # exits without a sample): found by the malformed-input battery. Symbols (& < 🙂) are read out.
        raise ValueError("is only punctuation; there is nothing to say")
    for position, char in enumerate(text):
        category = unicodedata.category(char)
        if category == "Cs":
            raise ValueError(
                f"is not valid Unicode: a lone surrogate U+{ord(char):04X} at character {position} "
                "(bytes that were not UTF-8?)"
            )
        if category == "Cc" and char not in _ALLOWED_CONTROLS:
            raise ValueError(f"holds the control character U+{ord(char):04X} at character {position}")
    return text


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, in order, whitespace-normalised, none empty."""
    sentences: list[str] = []
    pending = ""
    start = 0
    for match in _END.finditer(text):
        piece = pending + text[start : match.start()] + match.group(0).rstrip()
        start = match.end()
        if _ABBREVIATION.search(piece.rstrip()) and "\n" not in match.group(0):
            pending = piece + " "
            continue
        pending = ""
        sentences.append(piece)
    sentences.append(pending + text[start:])
    return [" ".join(s.split()) for s in sentences if s.strip()]


@dataclass(frozen=True)
class Piece:
    """What one engine speaks at once. Attributes: text, sentence (index of its sentence)."""

    text: str
    sentence: int


@dataclass(frozen=True)
class Chunk:
    """Pieces spoken by one engine call, in order. Attributes: index, pieces."""

    index: int
    pieces: tuple[Piece, ...]

    @property
    def chars(self) -> int:
        return sum(len(p.text) for p in self.pieces)


@dataclass(frozen=True)
class Plan:
    """A text cut for an engine. Attributes: sentences, chunks."""

    sentences: tuple[str, ...]
    chunks: tuple[Chunk, ...]


def _cut(sentence: str, max_chars: int) -> list[str]:
    """A sentence as pieces of at most ``max_chars``: at clause marks, then between words, then hard."""
    if len(sentence) <= max_chars:
        return [sentence]
    pieces: list[str] = []
    for part in _CLAUSE.split(sentence):
        for word in part.split(" ") if len(part) > max_chars else [part]:
            while len(word) > max_chars:  # one "word" longer than a chunk (a URL, a number)
                pieces.append(word[:max_chars])
                word = word[max_chars:]
            if pieces and len(pieces[-1]) + 1 + len(word) <= max_chars:
                pieces[-1] = f"{pieces[-1]} {word}"
            elif word:
                pieces.append(word)
    return pieces


def plan_chunks(text: str, max_chars: int) -> Plan:
    """Sentences of ``text`` packed in order into chunks of at most ``max_chars`` characters, the
    first sentence in a chunk of its own."""
    if max_chars < 1:
        raise ValueError("max_chars must be positive")
    sentences = split_sentences(text)
    chunks: list[Chunk] = []
    current: list[Piece] = []
    size = 0
    for index, sentence in enumerate(sentences):
        for piece in _cut(sentence, max_chars):
            if current and size + len(piece) > max_chars:
                chunks.append(Chunk(len(chunks), tuple(current)))
                current, size = [], 0
            current.append(Piece(piece, index))
            size += len(piece)
        if index == 0:  # a first sentence longer than a chunk has filled some already
            chunks.append(Chunk(len(chunks), tuple(current)))
            current, size = [], 0
    if current:
        chunks.append(Chunk(len(chunks), tuple(current)))
    return Plan(tuple(sentences), tuple(chunks))
