"""Which spans the camera filter keeps: padding, merging, widening, reasons."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mediafarm.tasks.families.camfilter.plan import Clip, ClipRules, plan_clips
from mediafarm.tasks.media.intervals import Span

RULES = ClipRules(pad_before=1.0, pad_after=2.0, min_gap=3.0, min_clip=4.0)


def test_speech_and_person_close_together_are_one_clip_with_both_reasons() -> None:
    clips = plan_clips({"speech": [Span(10, 12)], "person": [Span(14, 20)], }, duration=100, rules=RULES)
    assert clips == [Clip(9.0, 22.0, ("person", "speech"))]


def test_spans_far_apart_stay_separate_and_keep_their_own_reason() -> None:
    clips = plan_clips({"speech": [Span(10, 15)], "person": [Span(40, 50)]}, duration=100, rules=RULES)
    assert clips == [Clip(9.0, 17.0, ("speech",)), Clip(39.0, 52.0, ("person",))]


def test_a_short_detection_is_widened_not_dropped_and_stays_inside_the_video() -> None:
    [clip] = plan_clips({"person": [Span(99.5, 99.6)]}, duration=100, rules=ClipRules(pad_before=0, pad_after=0,
                                                                                         min_gap=0, min_clip=4))
    assert (clip.start, clip.end) == (96.0, 100.0)
    [clip] = plan_clips({"person": [Span(0.1, 0.2)]}, duration=2.5, rules=RULES)
    assert (clip.start, clip.end) == (0.0, 2.5)  # the whole video is shorter than min_clip


def test_nothing_seen_or_heard_keeps_nothing() -> None:
    assert plan_clips({"speech": [], "person": []}, duration=60, rules=RULES) == []
    assert plan_clips({"person": [Span(70, 80)]}, duration=60, rules=RULES) == []  # past the end


spans = st.lists(
    st.tuples(st.floats(0, 300), st.floats(0.01, 30)).map(lambda t: Span(t[0], t[0] + t[1])), max_size=12
)


@settings(max_examples=200, deadline=None)
@given(speech=spans, person=spans, duration=st.floats(1, 320),
       pad=st.floats(0, 5), gap=st.floats(0, 10), minimum=st.floats(0, 10))  # fmt: skip
def test_clips_are_ordered_disjoint_inside_the_video_and_cover_every_span(speech, person, duration, pad, gap, minimum):
    rules = ClipRules(pad_before=pad, pad_after=pad, min_gap=gap, min_clip=minimum)
    clips = plan_clips({"speech": speech, "person": person}, duration=duration, rules=rules)
    for a, b in zip(clips, clips[1:]):
        assert a.end < b.start
    for clip in clips:
        assert 0 <= clip.start < clip.end <= duration + 1e-9
        assert clip.end - clip.start >= min(minimum, duration) - 1e-9
    for reason, reason_spans in (("speech", speech), ("person", person)):
        for span in reason_spans:
            if span.start >= duration:
                continue
            inside = [c for c in clips if c.start <= span.start + 1e-9 and min(span.end, duration) <= c.end + 1e-9]
            assert inside and reason in inside[0].reasons, (span, clips)
