"""TTS requests and text: what is refused (and how it says so), how text is cut into sentences and chunks."""

from __future__ import annotations

import pytest

from mediafarm.tasks.families.tts.spec import FAMILY
from mediafarm.tasks.families.tts.text import MAX_TEXT_CHARS, plan_chunks, split_sentences
from mediafarm.tasks.wire.errors import InvalidRequest


def parse(**fields):
    return FAMILY.parse_request(fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"text": ""}, "empty or only whitespace"),
        ({"text": " \n\t "}, "empty or only whitespace"),
        ({"text": "x" * (MAX_TEXT_CHARS + 1)}, "the maximum is 100,000"),
        ({"text": "bad \udcff bytes"}, "lone surrogate U+DCFF at character 4"),
        ({"text": "nul\x00inside"}, "control character U+0000 at character 3"),
        ({"text": "bell\x07"}, "control character U+0007"),
        ({"text": "... - ?! …"}, "is only punctuation"),
        ({"text": "hi", "speed": 3}, "speed"),
        ({"text": "hi", "format": "flac"}, "format"),
        ({"text": "hi", "speaker": "no spaces please"}, "speaker"),
        ({"text": "hi", "voice": "x"}, "voice: Extra inputs are not permitted"),
        ({"text": 42}, "text"),
    ],
)
def test_bad_requests_are_rejected_naming_the_problem(fields, message) -> None:
    with pytest.raises(InvalidRequest, match=message.replace("(", r"\(").replace("+", r"\+")):
        parse(**fields)


def test_a_good_request_keeps_newlines_and_takes_the_documented_maximum() -> None:
    request = parse(text="Line one.\nLine two.\t" + "a" * (MAX_TEXT_CHARS - 20), speed=0.5, format="mp3")
    assert len(request.text) == MAX_TEXT_CHARS and request.speaker == "default" and request.format == "mp3"


def test_sentences_split_at_ends_not_at_abbreviations() -> None:
    text = 'Dr. Smith met Mr. Jones. "Is it late?" he asked!  Yes… it was.\n\nA heading\n\nThe end'
    assert split_sentences(text) == [
        "Dr. Smith met Mr. Jones.", '"Is it late?"', "he asked!", "Yes…", "it was.", "A heading", "The end",
    ]  # fmt: skip


def test_chunks_keep_order_fit_the_limit_and_cut_long_sentences_into_pieces() -> None:
    long = "one, " * 30 + "and done."
    plan = plan_chunks(f"Short. {long} Last one.", 40)
    pieces = [p for c in plan.chunks for p in c.pieces]
    assert all(c.chars <= 40 for c in plan.chunks) and [c.index for c in plan.chunks] == list(range(len(plan.chunks)))
    assert [p.sentence for p in pieces] == sorted(p.sentence for p in pieces)  # in order
    assert " ".join(p.text for p in pieces if p.sentence == 1) == long.strip()  # nothing lost
    assert sum(p.sentence == 1 for p in pieces) > 3 and plan.sentences == ("Short.", long.strip(), "Last one.")
    # A "word" longer than a chunk is cut hard rather than overflowing it.
    assert all(len(p.text) <= 10 for c in plan_chunks("x" * 35 + ".", 10).chunks for p in c.pieces)


def test_a_100_kb_text_plans_quickly_into_bounded_chunks() -> None:
    text = ("The quick brown fox jumps over the lazy dog, again and again. " * 1700)[:MAX_TEXT_CHARS]
    plan = plan_chunks(parse(text=text).text, 400)
    assert len(plan.sentences) == 1613 and max(c.chars for c in plan.chunks) <= 400
    assert sum(c.chars for c in plan.chunks) >= 0.97 * len(text)  # only separating spaces dropped
