"""The toy family's engines: a generator that streams words, and a plain counter below it."""

from __future__ import annotations

import time
from collections.abc import Iterator

from mediafarm.tasks.kit import EngineContext
from tests.support.toy import CountParams, ToyRejected, ToyRequest, ToyResult


def _check(request: ToyRequest) -> list[str]:
    words = request.text.split()
    if "forbidden" in words:
        raise ToyRejected("the word 'forbidden' is not allowed")
    return words


def stream_words(ctx: EngineContext, request: ToyRequest, params: CountParams) -> Iterator[dict]:
    """Yields each word as a partial output, then returns the result; writes words.txt."""
    words = _check(request)
    done = []
    for i, word in enumerate(words):
        if i and request.word_pause:
            time.sleep(request.word_pause)
            ctx.check_cancelled()
        if request.fail_after is not None and i >= request.fail_after:
            raise MemoryError(f"toy: out of memory after {i} words")
        done.append(word.upper() if params.upper else word)
        ctx.progress((i + 1) / len(words), stage="streaming")
        yield {"index": i, "word": done[-1]}
    _write(ctx, done, request.write_pause)
    return ToyResult(words=done, engine="stream")


def count_words(ctx: EngineContext, request: ToyRequest, params: CountParams) -> ToyResult:
    words = [w.upper() if params.upper else w for w in _check(request)]
    _write(ctx, words, 0.0)
    return ToyResult(words=words, engine="plain")


def _write(ctx: EngineContext, words: list[str], pause: float) -> None:
    # Half the file, a pause (a test kills the child here), then the rest.
    with ctx.artifacts.open("words.txt", "w", encoding="utf-8") as fh:
        half = len(words) // 2
        fh.write("\n".join(words[:half]) + "\n")
        fh.flush()
        time.sleep(pause)
        fh.write("\n".join(words[half:]) + "\n")
