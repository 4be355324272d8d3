"""``/v1/models`` as a function of the live capability records (``gateway.openai.models.listing``):
what no live worker can run is not listed, and with no live worker at all the list says so."""

from __future__ import annotations

from mediafarm.gateway.openai.models import listing
from mediafarm.tasks.wire.capability import WorkerCapability

GPU = "rung needs a GPU and this pool has none"


def subtitle_worker(node: str, pool: str, **why: str) -> WorkerCapability:
    rungs = {name: why.get(name.replace("-", "_"), "") for name in ("whisper-large", "whisper-small", "whisper-tiny",
                                                                     "pocketsphinx")}  # fmt: skip
    return WorkerCapability(node, pool, ("subtitle",), {}, ("subtitle",), {"subtitle": {"subtitle": rungs}})


def test_with_no_live_worker_nothing_is_listed_and_the_list_says_why() -> None:
    answer = listing([])
    assert answer["object"] == "list" and answer["data"] == []
    assert answer["farm"]["live_workers"] == 0 and "no live worker" in answer["farm"]["note"]


def test_only_what_a_live_worker_can_run_is_listed_with_its_pools() -> None:
    cpu = subtitle_worker("cpu@a", "cpu", whisper_large=GPU, whisper_small="model absent")
    gpu = subtitle_worker("gpu0@b", "gpu0", whisper_small="model absent", whisper_tiny="model absent")
    models = {m["id"]: m["farm"] for m in listing([cpu, gpu])["data"]}
    assert "whisper-small" not in models
    assert {"whisper-large", "whisper-tiny", "pocketsphinx", "whisper-1"} <= set(models)
    assert models["whisper-1"]["rungs"] == ["whisper-large", "whisper-tiny", "pocketsphinx"]
    assert models["whisper-1"]["unavailable"] == ["whisper-small"] and models["whisper-1"]["alias_of"] == "subtitle"
    assert models["whisper-large"]["pools"] == {"whisper-large": ["gpu0"], "whisper-tiny": ["cpu"],
                                                "pocketsphinx": ["cpu", "gpu0"]}  # fmt: skip
    # Nothing of tts: no live worker takes its queue.
    assert not any(m["family"] == "tts" for m in models.values())
    # A worker that leaves the family's queue out does not count, whatever its rungs say.
    idle = WorkerCapability("cpu@c", "cpu", ("other",), {"subtitle": "no rung runnable"}, (),
                            {"subtitle": {"subtitle": {"pocketsphinx": ""}}})  # fmt: skip
    assert listing([idle])["data"] == [] and listing([idle])["farm"] == {"live_workers": 1}
