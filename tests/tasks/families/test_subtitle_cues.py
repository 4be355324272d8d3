"""Cues from timed words: a property test over random word streams and rules, and worked examples."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mediafarm.tasks.families.subtitle.cues import MIN_CUE_EPSILON, build_cues, cue_rules_violations, final_cues
from mediafarm.tasks.families.subtitle.records import Cue, CueRules, Word

TOL = 1e-6

LETTERS = "abcdefghijklmnopqrstuvwxyzéüß'-"
PUNCTUATION = ["", "", "", "", ",", ".", "?", "!", "…", ";", ":", '."', "...", ")"]


@st.composite
def rules(draw) -> CueRules:
    max_cue = draw(st.floats(0.51, 30.0))
    return CueRules(
        max_line_chars=draw(st.integers(10, 200)),
        max_lines=draw(st.integers(1, 4)),
        max_cue_seconds=max_cue,
        min_gap_seconds=draw(st.floats(0.0, 2.0)),
        min_cue_seconds=draw(st.floats(0.0, min(5.0, max_cue))),
        sentence_pause_seconds=draw(st.floats(0.01, 10.0)),
    )


@st.composite
def word_streams(draw) -> list[Word]:
    """Words with starts in order; gaps from overlap to long pauses; durations from 0 to 40 s."""
    words: list[Word] = []
    start, end = draw(st.floats(0.0, 5.0)), 0.0
    for _ in range(draw(st.integers(0, 60))):
        kind = draw(st.sampled_from(["short", "short", "short", "long", "empty"]))
        if kind == "empty":
            text = draw(st.sampled_from(["", " ", "\t"]))
        else:
            size = (1, 12) if kind == "short" else (30, 230)  # long ones beat any line width
            text = draw(st.text(LETTERS, min_size=size[0], max_size=size[1])) + draw(st.sampled_from(PUNCTUATION))
        gap = draw(st.one_of(st.just(0.0), st.floats(-0.3, 0.0), st.floats(0.0, 0.6), st.floats(0.6, 15.0)))
        duration = draw(st.one_of(st.just(0.0), st.floats(0.0, 1.0), st.floats(1.0, 40.0)))
        start = max(start, end + gap)
        end = start + duration
        words.append(Word(text=text, start=start, end=end))
    return words


def silence_before(words: list[Word]) -> dict[int, float]:
    """Seconds of silence before each word (by id): after the latest end of all earlier words."""
    out, heard_until = {}, float("-inf")
    for word in words:
        if word.text.strip():
            out[id(word)] = word.start - heard_until
            heard_until = max(heard_until, word.end)
    return out


def cue_words(cues: list[Cue], words: list[Word]) -> list[list[Word]]:
    """The words of each cue, by counting the tokens of its text."""
    kept = [w for w in words if w.text.strip()]
    out, at = [], 0
    for cue in cues:
        count = len(cue.text.split())
        out.append(kept[at : at + count])
        at += count
    assert at == len(kept)
    return out


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=word_streams(), rules=rules())
def test_random_words_make_cues_that_keep_every_rule(words: list[Word], rules: CueRules) -> None:
    cues = build_cues(words, rules)

    assert cue_rules_violations(cues, rules) == []
    tokens = [token for cue in cues for line in cue.lines for token in line.split()]
    assert tokens == [w.text for w in words if w.text.strip()]
    for cue, following in itertools.pairwise(cues):
        assert cue.start < cue.end <= following.start < following.end
    heard_before = silence_before(words)
    previous_end = 0.0
    for cue, own in zip(cues, cue_words(cues, words), strict=True):
        first_start = own[0].start
        assert first_start - TOL <= cue.start <= max(first_start, previous_end) + TOL
        stretched = max(max(w.end for w in own), cue.start + rules.min_cue_seconds, cue.start + MIN_CUE_EPSILON)
        assert cue.end <= stretched + TOL
        for word in own[1:]:  # no cue hangs over a long pause
            assert heard_before[id(word)] < rules.sentence_pause_seconds
        previous_end = cue.end


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=word_streams(), rules=rules(), batch=st.integers(1, 12))
def test_final_cues_taken_while_words_arrive_are_the_cues_of_the_whole(
    words: list[Word], rules: CueRules, batch: int
) -> None:
    collected: list[Cue] = []
    pending: list[Word] = []
    for at in range(0, len(words), batch):
        pending += words[at : at + batch]
        done, count = final_cues(pending, rules)
        collected += done
        pending = pending[count:]
    collected += build_cues(pending, rules)
    assert collected == build_cues(words, rules)


def test_only_a_long_pause_makes_cues_final() -> None:
    rules = CueRules()
    talk = timed("One sentence here. Another one follows. And a third one comes right after it, with no break.")
    assert final_cues(talk, rules) == ([], 0)  # later words could still move every cue end
    later = timed("Then more.", start=talk[-1].end + 2.0)
    done, count = final_cues(talk + later, rules)
    assert count == len(talk)
    assert done == build_cues(talk + later, rules)[: len(done)]
    assert " ".join(c.text.replace("\n", " ") for c in done) == " ".join(w.text for w in talk)


def timed(text: str, step: float = 0.35, length: float = 0.3, start: float = 0.0) -> list[Word]:
    """One word every ``step`` seconds."""
    return [Word(text=w, start=start + k * step, end=start + k * step + length) for k, w in enumerate(text.split())]


def test_a_sentence_end_is_preferred_over_a_balanced_split() -> None:
    rules = CueRules(max_lines=1)
    text = "The meeting ran late yesterday. We all went home and slept well."  # 64 chars: two cues
    cues = build_cues(timed(text), rules)
    assert [c.text for c in cues] == ["The meeting ran late yesterday.", "We all went home and slept well."]


def test_a_comma_is_preferred_over_a_mid_clause_split() -> None:
    rules = CueRules(max_lines=1, max_line_chars=42)
    text = "When the rain stopped at last, we all walked to the old station"
    cues = build_cues(timed(text), rules)
    assert cues[0].text == "When the rain stopped at last,"


def test_lines_hold_at_most_42_characters_and_break_evenly() -> None:
    rules = CueRules()
    cues = build_cues(timed("one two three four five six seven eight nine ten eleven twelve"), rules)
    assert [list(c.lines) for c in cues] == [["one two three four five six seven", "eight nine ten eleven twelve"]]

    long_text = " ".join(["Subtitles must stay readable, so every line keeps to the limit."] * 8)
    cues = build_cues(timed(long_text, step=0.2, length=0.15), rules)
    assert cue_rules_violations(cues, rules) == []
    assert all(len(line) <= 42 for c in cues for line in c.lines)
    assert all(1 <= len(c.lines) <= 2 for c in cues)


def test_a_line_breaks_after_punctuation_rather_than_evenly() -> None:
    cues = build_cues(timed("At last, the train pulled into the station slowly"), CueRules())
    assert list(cues[0].lines) == ["At last,", "the train pulled into the station slowly"]


def test_a_word_wider_than_a_line_sits_alone_on_it() -> None:
    word = "Pneumonoultramicroscopicsilicovolcanoconiosis-like"  # 50 characters
    cues = build_cues(timed(f"it is {word} indeed"), CueRules(max_lines=3))
    assert list(cues[0].lines) == ["it is", word, "indeed"]


def test_cues_last_at_most_7_seconds() -> None:
    rules = CueRules()  # max_cue_seconds 7
    cues = build_cues(timed(" ".join(["la"] * 40), step=0.5, length=0.4), rules)  # 20 s, no pause
    assert len(cues) >= 3
    assert all(c.end - c.start <= 7.0 + TOL for c in cues)
    assert cue_rules_violations(cues, rules) == []


def test_a_word_longer_than_the_cue_limit_is_a_cue_of_its_own() -> None:
    rules = CueRules()
    words = [
        Word(text="so", start=0.0, end=0.2),
        Word(text="ummmm", start=0.2, end=9.2),
        Word(text="yes", start=9.2, end=9.5),
    ]
    cues = build_cues(words, rules)
    assert [c.text for c in cues] == ["so", "ummmm", "yes"]
    assert cues[1].end - cues[1].start > 7.0
    assert cue_rules_violations(cues, rules) == []


def test_a_long_pause_ends_a_cue_and_a_short_cue_is_stretched() -> None:
    rules = CueRules()
    words = [Word(text="Hi", start=1.0, end=1.2), Word(text="there", start=3.0, end=3.3)]
    cues = build_cues(words, rules)
    assert [c.text for c in cues] == ["Hi", "there"]
    assert cues[0].start == 1.0 and cues[0].end == pytest.approx(1.7)  # stretched to min_cue_seconds
    assert cues[1].end == pytest.approx(3.7)


def test_stretching_stops_at_the_gap_before_the_next_cue() -> None:
    rules = CueRules(max_lines=1, max_line_chars=10)
    words = [Word(text="Stop.", start=0.0, end=0.2), Word(text="Go.", start=0.5, end=0.7)]
    cues = build_cues(words, rules)
    assert [c.text for c in cues] == ["Stop. Go."]  # fits: one cue
    words = [Word(text="Stop.", start=0.0, end=0.2), Word(text="Go-go-go-go.", start=0.5, end=0.7)]
    cues = build_cues(words, rules)
    assert cues[0].end == pytest.approx(0.5 - rules.min_gap_seconds)
    assert cue_rules_violations(cues, rules) == []


def test_empty_words_go_and_messy_times_still_give_valid_cues() -> None:
    rules = CueRules(max_lines=1, max_line_chars=10)
    words = [
        Word(text="", start=0.0, end=0.1),
        Word(text="first", start=1.0, end=1.0),  # no duration
        Word(text="second", start=1.0, end=1.0),  # same instant
        Word(text="third", start=0.9, end=0.8),  # back in time, end before start
        Word(text="New York", start=1.2, end=1.6),  # inner space: two tokens
        Word(text="  ", start=2.0, end=2.1),
    ]
    cues = build_cues(words, rules)
    assert " ".join(c.text.replace("\n", " ") for c in cues) == "first second third New York"
    assert cue_rules_violations(cues, rules) == []
    assert build_cues([], rules) == []
    assert build_cues([Word(text=" ", start=0, end=1)], rules) == []


def test_a_time_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(ValueError, match="not finite"):
        build_cues([Word(text="x", start=float("nan"), end=1.0)], CueRules())


def test_the_checker_names_each_violation() -> None:
    rules = CueRules(max_line_chars=10, max_lines=1)
    cues = [
        Cue(start=0.0, end=8.0, lines=["far too wide a line", "two"]),
        Cue(start=7.5, end=7.6, lines=["overlap"]),
        Cue(start=7.62, end=9.0, lines=["close"]),
        # A Cue refuses an empty line itself; the checker must still catch one built around that.
        Cue.model_construct(start=20.0, end=20.1, lines=("",)),
    ]
    found = "\n".join(cue_rules_violations(cues, rules))
    for phrase in ["2 lines", "characters", "lasts 8.000 s", "overlaps", "leaves 0.020 s", "with room", "empty line"]:
        assert phrase in found
    assert cue_rules_violations([], rules) == []
