"""Readable cues from timed words, and the check that cues keep their rules.

Three passes, each a plain function:

1. ``_tokens`` cleans the words: empty ones go, times are put in order (recognisers, Whisper among
   them, give words that overlap or step back by a few milliseconds), a "word" with inner spaces
   becomes one token per visible word so that every space on a line is a word boundary.
2. ``_cue_ranges`` decides where cues end. A pause >= ``sentence_pause_seconds`` always ends one
   (a cue must not hang over silence). Between such pauses a dynamic programme picks the cue ends:
   hard limits (lines, characters a line, seconds a cue) are never crossed, and among the layouts
   that keep them it prefers sentence ends, then clause ends (commas, short pauses), then cues of
   even length, then fewer cues. It costs O(words x words a cue), never O(words²).
3. ``_timed`` gives each cue its time: first word start to last word end, stretched to
   ``min_cue_seconds`` where the next cue leaves room, trimmed to keep ``min_gap_seconds``.

Because of pass 2, a cue is final only once a long pause follows its stretch: ``final_cues`` tells
a streaming caller which cues those are.

Line breaks inside a cue (``_break_lines``) use as few lines as the text needs and, among those,
prefer breaks after punctuation, then even lines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from mediafarm.tasks.families.subtitle.records import Cue, CueRules, Word

# The least a cue lasts when the gap rule or overlapping words would squeeze it to nothing.
# 10 ms: above WebVTT's/SRT's millisecond rounding, so a written cue still ends after it starts.
MIN_CUE_EPSILON = 0.01

# Slack for float sums (start + min_cue_seconds) in the checks; far below a millisecond.
_TOLERANCE = 1e-6

_SENTENCE_END = (".", "!", "?", "…", "。", "！", "？")
_CLAUSE_END = (",", ";", ":", "–", "—", "，", "、", "；", "：")
_CLOSERS = "\"'”’»)]}"  # a sentence can end inside quotes or brackets: 'He said "no."'


class Boundary(IntEnum):
    """What lies between one token and the next; the lower, the better a place to end a cue or line."""

    SENTENCE = 0
    CLAUSE = 1
    NONE = 2


# Costs of the cue choice. Their order is the preference order the rules ask for: ending mid-clause
# costs more than any imbalance can, and imbalance (at most _FILL_WEIGHT a cue) less than a cue.
_CUE_END_COST = {Boundary.SENTENCE: 0.0, Boundary.CLAUSE: 1.0, Boundary.NONE: 3.0}
_CUE_COST = 1.0
_FILL_WEIGHT = 0.5
# Line breaks: punctuation first, then balance (the balance term stays below 0.5 for two lines).
_LINE_BREAK_COST = {Boundary.SENTENCE: 0.0, Boundary.CLAUSE: 0.5, Boundary.NONE: 1.0}
_BALANCE_WEIGHT = 1.0


@dataclass(frozen=True, slots=True)
class _Token:
    """A word with clean times and what follows it.

    Attributes:
        text: One visible word, no whitespace.
        start: Seconds, >= the previous token's start and >= 0.
        end: Seconds, >= start.
        after: The boundary between this token and the next.
        word: The index of the word it comes from.
    """

    text: str
    start: float
    end: float
    after: Boundary
    word: int


def build_cues(words: Sequence[Word], rules: CueRules) -> list[Cue]:
    """Readable cues from timed words, in order, non-overlapping, every word once.

    Raises:
        ValueError: A word has a time that is not a finite number.
    """
    return [cue for cue, _ in _cues(_tokens(words, rules), rules)]


def final_cues(words: Sequence[Word], rules: CueRules) -> tuple[list[Cue], int]:
    """The leading cues of ``build_cues(words)`` that later words cannot change, and how many of
    ``words`` they hold, for a caller that builds cues while recognition runs.

    Cue ends are chosen over a whole stretch between pauses of at least ``sentence_pause_seconds``,
    so a later word can move every cue end of the stretch it joins; cues are final only once such a
    pause closes their stretch. The last of them is timed from the next word's start, which is among
    ``words``. A caller keeps ``words[count:]``, appends what it hears next, and calls again: the
    cues it collects are those of ``build_cues`` on all the words at once.

    Raises:
        ValueError: A word has a time that is not a finite number.
    """
    tokens = _tokens(words, rules)
    groups = _pause_groups(tokens, rules)
    cues = _cues(tokens, rules) if len(groups) > 1 else []
    for first, _ in reversed(groups[1:]):
        settled = [cue for cue, after in cues if after <= first]
        # A cue pushed late by words piled up at one instant can reach past the pause; the stretch
        # after it then starts later than its first word, which a call on the rest would not know.
        if settled[-1].end <= tokens[first].start:
            return settled, tokens[first].word
    return [], 0


def _cues(tokens: Sequence[_Token], rules: CueRules) -> list[tuple[Cue, int]]:
    """Each cue with the index of the token after its last."""
    ranges: list[tuple[int, int]] = []
    for first, last in _pause_groups(tokens, rules):
        ranges.extend((first + a, first + b) for a, b in _cue_ranges(tokens[first:last], rules))
    spans = [(tokens[a].start, max(t.end for t in tokens[a:b])) for a, b in ranges]
    return [
        (Cue(start=start, end=end, lines=_break_lines(tokens[a:b], rules)), b)
        for (a, b), (start, end) in zip(ranges, _timed(spans, rules), strict=True)
    ]


def cue_rules_violations(cues: Sequence[Cue], rules: CueRules) -> list[str]:
    """Every way ``cues`` break ``rules``, one sentence each; empty when they keep them all.

    The exceptions ``build_cues`` is allowed are allowed here too: a single word may be wider than a
    line and longer than ``max_cue_seconds``; a cue at its least length (``MIN_CUE_EPSILON``) may
    sit closer than ``min_gap_seconds`` to the next; a cue may be shorter than ``min_cue_seconds``
    when the next cue leaves no room.
    """
    problems: list[str] = []
    for k, cue in enumerate(cues):
        name = f"cue {k} [{cue.start:.3f}-{cue.end:.3f}]"
        duration = cue.end - cue.start
        single_word = len(cue.lines) == 1 and len(cue.lines[0].split()) == 1
        if cue.start < 0:
            problems.append(f"{name} starts before the media")
        if not cue.lines or any(not line.strip() for line in cue.lines):
            problems.append(f"{name} has an empty line")
        if len(cue.lines) > rules.max_lines:
            problems.append(f"{name} has {len(cue.lines)} lines, more than {rules.max_lines}")
        for line in cue.lines:
            if len(line) > rules.max_line_chars and len(line.split()) > 1:
                problems.append(f"{name} has a line of {len(line)} characters, more than {rules.max_line_chars}")
        if duration < MIN_CUE_EPSILON - _TOLERANCE:
            problems.append(f"{name} lasts {duration:.4f} s, less than {MIN_CUE_EPSILON} s")
        if duration > rules.max_cue_seconds + _TOLERANCE and not single_word:
            problems.append(f"{name} lasts {duration:.3f} s, more than {rules.max_cue_seconds} s")
        following = cues[k + 1] if k + 1 < len(cues) else None
        if following is not None:
            gap = following.start - cue.end
            at_least_length = duration <= MIN_CUE_EPSILON + _TOLERANCE
            if following.start < cue.start:
                problems.append(f"{name} starts after the next cue")
            if gap < -_TOLERANCE:
                problems.append(f"{name} overlaps the next cue by {-gap:.3f} s")
            elif gap < rules.min_gap_seconds - _TOLERANCE and not at_least_length:
                problems.append(f"{name} leaves {gap:.3f} s to the next cue, less than {rules.min_gap_seconds} s")
        room = following is None or following.start - cue.end > rules.min_gap_seconds + _TOLERANCE
        if duration < rules.min_cue_seconds - _TOLERANCE and room:
            problems.append(f"{name} lasts {duration:.3f} s, less than {rules.min_cue_seconds} s, with room to stretch")
    return problems


def _tokens(words: Sequence[Word], rules: CueRules) -> list[_Token]:
    """Clean tokens with ordered times and the boundary after each."""
    raw: list[tuple[str, float, float, int]] = []
    last_start = 0.0
    for index, word in enumerate(words):
        if not (math.isfinite(word.start) and math.isfinite(word.end)):
            raise ValueError(f"word {word.text!r} has a time that is not finite: {word.start}-{word.end}")
        parts = word.text.split()
        if not parts:
            continue
        # Starts never go back, so cues stay in order; an end before its start means no duration.
        start = max(word.start, last_start)
        end = max(word.end, start)
        last_start = start
        # Inner spaces would be line-break points the line checks cannot tell from word boundaries;
        # the word's time is shared by its parts in proportion to their length.
        total = sum(len(p) for p in parts)
        cursor = start
        for part in parts:
            share = (end - start) * len(part) / total
            raw.append((part, cursor, min(cursor + share, end), index))
            cursor += share
    tokens: list[_Token] = []
    heard_until = -math.inf  # the latest end so far: a pause is silence after every earlier word
    for k, (text, start, end, index) in enumerate(raw):
        heard_until = max(heard_until, end)
        after = Boundary.NONE
        if k + 1 < len(raw):
            pause = raw[k + 1][1] - heard_until
            after = _boundary(text, pause, rules)
        tokens.append(_Token(text, start, end, after, index))
    return tokens


def _boundary(text: str, pause: float, rules: CueRules) -> Boundary:
    bare = text.rstrip(_CLOSERS) or text
    if bare.endswith(_SENTENCE_END):
        return Boundary.SENTENCE
    # Half the sentence pause: a breath inside a sentence, as good a place as a comma.
    if bare.endswith(_CLAUSE_END) or pause >= rules.sentence_pause_seconds / 2:
        return Boundary.CLAUSE
    return Boundary.NONE


def _pause_groups(tokens: Sequence[_Token], rules: CueRules) -> list[tuple[int, int]]:
    """Half-open token ranges between pauses of at least ``sentence_pause_seconds``."""
    groups: list[tuple[int, int]] = []
    first = 0
    heard_until = -math.inf
    for k, token in enumerate(tokens):
        if k > first and token.start - heard_until >= rules.sentence_pause_seconds:
            groups.append((first, k))
            first = k
        heard_until = max(heard_until, token.end)
    if first < len(tokens):
        groups.append((first, len(tokens)))
    return groups


def _cue_ranges(tokens: Sequence[_Token], rules: CueRules) -> list[tuple[int, int]]:
    """Half-open ranges of ``tokens`` (one pause group), one a cue, at the least total cost.

    ``best[j]`` is the cheapest way to make cues of the first ``j`` tokens. From each start the
    cue grows a token at a time while it still fits: the line count of a greedy fill is the least
    any layout needs, and both it and the duration only grow, so the first misfit ends the scan.
    A single token always fits, so every token count has a way.
    """
    if not tokens:
        return []
    n = len(tokens)
    capacity = rules.max_lines * rules.max_line_chars
    max_chars, max_lines, max_seconds = rules.max_line_chars, rules.max_lines, rules.max_cue_seconds
    # Plain lists and no calls in the inner loop: it runs words x words-a-cue times.
    sizes = [len(t.text) for t in tokens]
    ends = [t.end for t in tokens]
    ending = [_CUE_END_COST[t.after] for t in tokens]
    ending[-1] = 0.0  # the group ends at a pause or the end of the words
    best = [0.0] + [math.inf] * n
    back = [0] * (n + 1)
    for i in range(n):
        start, base = tokens[i].start, best[i] + _CUE_COST
        lines, width, chars, end = 1, sizes[i], sizes[i], ends[i]
        for j in range(i, n):
            if j > i:
                size = sizes[j]
                chars += 1 + size
                end = max(end, ends[j])
                if width + 1 + size <= max_chars:
                    width += 1 + size
                else:
                    lines, width = lines + 1, size
                if lines > max_lines or end - start > max_seconds:
                    break
            short = 1.0 - chars / capacity if chars < capacity else 0.0
            cost = base + _FILL_WEIGHT * short * short + ending[j]
            if cost < best[j + 1]:
                best[j + 1], back[j + 1] = cost, i
    ranges: list[tuple[int, int]] = []
    j = n
    while j > 0:
        ranges.append((back[j], j))
        j = back[j]
    return ranges[::-1]


def _timed(spans: Sequence[tuple[float, float]], rules: CueRules) -> list[tuple[float, float]]:
    """Cue times from (first word start, last word end) spans, in order and non-overlapping.

    The gap to the next cue wins over the least length, and order and non-overlap win over the
    gap: when words pile up at one instant, a cue keeps ``MIN_CUE_EPSILON`` and pushes the next
    cue's start to its end.
    """
    timed: list[tuple[float, float]] = []
    pushed_to = 0.0
    for k, (first_start, last_end) in enumerate(spans):
        start = max(first_start, pushed_to)
        end = max(last_end, start + rules.min_cue_seconds, start + MIN_CUE_EPSILON)
        if k + 1 < len(spans):
            end = min(end, spans[k + 1][0] - rules.min_gap_seconds)
        end = max(end, start + MIN_CUE_EPSILON)
        timed.append((start, end))
        pushed_to = end
    return timed


def _break_lines(tokens: Sequence[_Token], rules: CueRules) -> list[str]:
    """The cue's text in as few lines as it needs, breaking after punctuation, then evenly."""
    texts = [t.text for t in tokens]
    whole = " ".join(texts)
    limit = rules.max_line_chars
    if len(whole) <= limit:
        return [whole]
    count = _greedy_line_count(texts, limit)
    n = len(texts)
    offsets = [0]
    for text in texts:
        offsets.append(offsets[-1] + len(text))
    breaking = [_LINE_BREAK_COST[t.after] for t in tokens]
    breaking[-1] = 0.0  # the cue's end is no line break
    mean = (len(whole) - (count - 1)) / count  # the line widths always add up to this times count
    # cost[k][j]: the best k lines holding the first j tokens; cut[k][j]: where the k-th line starts.
    cost = [[math.inf] * (n + 1) for _ in range(count + 1)]
    cut = [[0] * (n + 1) for _ in range(count + 1)]
    cost[0][0] = 0.0
    for k in range(1, count + 1):
        before, here, cut_here = cost[k - 1], cost[k], cut[k]
        for j in range(k, n + 1):
            for i in range(j - 1, k - 2, -1):
                width = offsets[j] - offsets[i] + (j - i - 1)
                if width > limit and j - i > 1:
                    break  # wider still for every earlier i
                if before[i] == math.inf:
                    continue
                off = (width - mean) / limit
                total = before[i] + _BALANCE_WEIGHT * off * off + breaking[j - 1]
                if total < here[j]:
                    here[j], cut_here[j] = total, i
    lines: list[str] = []
    j = n
    for k in range(count, 0, -1):
        i = cut[k][j]
        lines.append(" ".join(texts[i:j]))
        j = i
    return lines[::-1]


def _greedy_line_count(texts: Sequence[str], limit: int) -> int:
    """Lines a greedy fill takes, which is the least any layout takes (a too-wide word sits alone)."""
    lines, width = 0, 0
    for text in texts:
        if lines and width + 1 + len(text) <= limit:
            width += 1 + len(text)
        else:
            lines, width = lines + 1, len(text)
    return lines
