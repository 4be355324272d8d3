"""Ladders that know languages (tasks.wire.languages): detection by script, codes, and the rung filter.

A rung that cannot handle the job's language is skipped as unavailable (recorded, no attempt
spent); a job no rung of its ladder can handle is rejected before anything runs, naming the
language and what each rung handles.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from mediafarm.config.ladders import Ladder, rung
from mediafarm.config.limits import TimeLimits
from mediafarm.tasks.runtime.downgrade import LadderRun, run_ladder
from mediafarm.tasks.runtime.rung_policies import Availability, Language
from mediafarm.tasks.wire.errors import InvalidRequest
from mediafarm.tasks.wire.family import EngineSpec, FamilySpec, Params, Request
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.languages import LanguageCheck, describe, normalize_language, script_language
from mediafarm.tasks.wire.records import Outcome


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("今天天气很好。", "zh"),
        ("Hello there, how are you?", None),  # Latin only: the script does not tell
        ("Bonjour à tous, ça va ?", None),
        ("我喜欢用 Python 写程序。", "zh"),  # mixed: the non-Latin script decides
        ("The word for hello is 你好.", "zh"),
        ("東京へ行きます。", "ja"),  # kana among Han characters: Japanese
        ("ｶﾀｶﾅ", "ja"),  # half-width katakana
        ("안녕하세요 friends", "ko"),
        ("Привет, мир", "ru"),
        ("Καλημέρα", "el"),
        ("12345 !?", None),
        ("Москва 北京上海天津重庆", "zh"),  # two other scripts: the one with more letters (8 to 6)
    ],
)
def test_the_script_tells_the_language(text: str, language: str | None) -> None:
    assert script_language(text) == language


@pytest.mark.parametrize(
    ("code", "normal"), [("en", "en"), ("en-US", "en"), ("en_GB", "en"), ("EN", "en"), ("cmn", "zh"),
                         ("yue", "zh"), ("zh-cmn", "zh"), ("fra", "fr"), ("fr-be", "fr"), ("eng", "en"), ("haw", "haw")]
)  # fmt: skip
def test_codes_compare_by_their_primary_language(code: str, normal: str) -> None:
    assert normalize_language(code) == normal


def test_describe() -> None:
    assert describe(None) == "any language"
    assert describe(frozenset({"zh", "en"})) == "en, zh"


class VoiceParams(Params):
    voice: str = "en"


class SayRequest(Request):
    text: str
    language: str | None = None


class SayResult(BaseModel):
    said: str


def _voice_languages(params: VoiceParams, models_dir: Path | None, request: Any) -> list[str]:
    if params.voice == "unreadable":  # as a hook reading a damaged voice file might fail
        raise AttributeError("'str' object has no attribute 'get'")
    return params.voice.split("+")


SPEC = FamilySpec(
    name="say",
    task_name="farm.say.speak",
    request=SayRequest,
    result=SayResult,
    engines={
        "voice": EngineSpec("x:y", VoiceParams, languages=_voice_languages),
        "any": EngineSpec("x:z"),  # declares nothing: any language
    },
    ladder=(rung("english", "voice", voice="en_US"), rung("mandarin", "voice", voice="cmn+en")),
    limits=TimeLimits(soft=10, hard=20),
    language=lambda request: request.language or script_language(request.text),
)


def test_a_job_in_a_language_no_rung_handles_is_rejected_naming_it_and_every_rung() -> None:
    ladder = Ladder("say", "say", (rung("english", "voice", voice="en_US"), rung("english-2", "voice", voice="en")))
    with pytest.raises(InvalidRequest) as caught:
        LanguageCheck.of(SPEC, ladder, {"text": "你好。"}, None)
    message = str(caught.value)
    assert "language 'zh'" in message and "english: en; english-2: en" in message


def test_no_filter_without_a_known_language_or_for_a_rung_declaring_none() -> None:
    assert LanguageCheck.of(SPEC, SPEC.default_ladder, {"text": "Hello."}, None) is None
    # A request that does not parse is left to the engine's own parse (rejected there, as always).
    assert LanguageCheck.of(SPEC, SPEC.default_ladder, {"txt": "你好"}, None) is None
    ladder = Ladder("say", "say", (rung("english", "voice", voice="en"), rung("anything", "any")))
    check = LanguageCheck.of(SPEC, ladder, {"text": "Bonjour.", "language": "fr-FR"}, None)
    assert check is not None and check.language == "fr"
    assert check.why_not(ladder.rungs[0]) == "rung english handles en, not the job's language 'fr'"
    assert check.why_not(ladder.rungs[1]) is None


def test_a_rung_that_cannot_handle_the_language_is_skipped_without_an_attempt(log: AttemptLog) -> None:
    ladder = SPEC.default_ladder
    check = LanguageCheck.of(SPEC, ladder, {"text": "今天天气很好。"}, None)
    assert check is not None and check.language == "zh"
    ran: list[str] = []

    def run_rung(rung_: Any, index: int, attempt: int) -> Any:
        ran.append(rung_.name)
        return {"said": "ok"}, ()

    job = LadderRun(log.job_id, ladder, SPEC.engines, log, worker="cpu@a", fresh=True,
                    policies=(Availability(), Language(check.why_not)))  # fmt: skip
    envelope = run_ladder(job, run_rung)
    assert ran == ["mandarin"] and envelope.rung == "mandarin"
    attempts, _ = log.read()
    assert [(a.rung, a.outcome) for a in attempts] == [("english", Outcome.UNAVAILABLE), ("mandarin", Outcome.OK)]
    assert attempts[0].reason == "rung english handles en, not the job's language 'zh'"
    # English text goes to the first rung, as before.
    english = LanguageCheck.of(SPEC, ladder, {"text": "Hi.", "language": "en"}, None)
    assert english is not None and english.why_not(ladder.rungs[0]) is None


def test_farm_families_notes_each_rungs_languages() -> None:
    from mediafarm.tasks.wire.languages import rung_languages_note

    notes = [rung_languages_note(SPEC, r, None) for r in SPEC.default_ladder.rungs]
    assert notes == [" (en)", " (en, zh)"]
    many = rung("many", "voice", voice="+".join(["en", "fr", "de", "es", "it"]))
    assert rung_languages_note(SPEC, many, None) == " (5 languages)"
    assert rung_languages_note(SPEC, rung("anything", "any"), None) == ""


def test_a_rung_in_farm_toml_may_state_its_languages() -> None:
    from mediafarm.config.file import ConfigFileError
    from mediafarm.config.ladders import _rung_from_table

    stated = _rung_from_table("say", {"name": "finetuned", "engine": "voice", "params": {"voice": "en"},
                                      "languages": ["fr", "en-CA"]})  # fmt: skip
    assert stated.languages == ("fr", "en-CA") and stated.to_json()["languages"] == ["fr", "en-CA"]
    assert rung_languages_of(stated) == frozenset({"fr", "en"})  # the operator's word over the engine's
    plain = _rung_from_table("say", {"name": "plain", "engine": "voice"})
    assert plain.languages is None and "languages" not in plain.to_json()
    with pytest.raises(ConfigFileError, match="languages must be a list"):
        _rung_from_table("say", {"name": "bad", "engine": "voice", "languages": "fr"})


def rung_languages_of(rung_: Any) -> Any:
    from mediafarm.tasks.wire.languages import rung_languages

    return rung_languages(SPEC, rung_, None)


def test_a_rung_whose_languages_hook_fails_is_not_filtered_and_the_job_not_failed() -> None:
    # One rung's hook failing must neither fail every job of the family before anything runs nor
    # skip a rung that may handle the job: it counts as declaring nothing (any language).
    ladder = Ladder("say", "say", (rung("broken", "voice", voice="unreadable"), rung("english", "voice", voice="en")))
    check = LanguageCheck.of(SPEC, ladder, {"text": "你好。"}, None)
    assert check is not None and check.rungs["broken"] is None
    assert check.why_not(ladder.rungs[0]) is None
    assert check.why_not(ladder.rungs[1]) == "rung english handles en, not the job's language 'zh'"
