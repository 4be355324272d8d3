"""The subtitle-render engine on a source document it cannot use: refused as bad input, naming the
field, where a missing key had failed the job as an engine error. No broker: the engine is called
on a storage folder of this test's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mediafarm.tasks.families.subtitle_render.engines import render
from mediafarm.tasks.families.subtitle_render.spec import RenderRequest
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.errors import PermanentFailure
from mediafarm.tasks.wire.family import NoParams

WORD = {"text": "hello", "start": 0.1, "end": 0.5}
GOOD = {"segments": [{"start": 0.0, "end": 1.0, "text": "hello", "words": [WORD]}],
        "speech": [{"start": 0.0, "end": 1.0}], "duration": 2.0, "language": "en"}  # fmt: skip


def rendered(storage: Path, document: object) -> object:
    (storage / "source").mkdir(parents=True)
    (storage / "source" / "subtitles.json").write_text(json.dumps(document))
    return render(EngineContext.local(storage_dir=storage), RenderRequest(source="source"), NoParams())


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ([1, 2], r"a JSON list where an object is expected"),
        ({"segments": [{"bogus": 1}]}, r"segments\.0\.start: Field required"),
        ({"segments": 5}, r"segments: Input should be a valid list"),
        ({"duration": "long"}, r"duration: Input should be a valid number"),
        ({"speech": [{"start": 1}]}, r"speech\.0\.end: Field required"),
    ],
    ids=["a list", "a segment without times", "segments a number", "duration a word", "a span without end"],
)
def test_a_source_document_that_is_not_a_subtitle_jobs_is_refused_naming_the_field(
    tmp_path: Path, document: object, reason: str
) -> None:
    refused = r"job 'source': subtitles\.json is not a subtitle job's document: "
    with pytest.raises(PermanentFailure, match=refused + reason):
        rendered(tmp_path, document)


def test_a_subtitle_jobs_document_renders(tmp_path: Path) -> None:
    result = rendered(tmp_path, GOOD)
    assert result.cues == 1 and result.timing.words_in_silence == 0 and set(result.files) == {"vtt", "srt"}
