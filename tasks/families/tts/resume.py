"""How a TTS job resumes after a lost attempt (issue #19): the rule, for the spec and ``farm families``.

A long text is spoken chunk by chunk, and every finished chunk is a WAV of its own
(``chunks/chunk_NNNNN.wav``, the track's exact samples). A checkpoint keeps those files and a small
state: where the track stands after the last one (samples, sentence times so far). The next
attempt feeds the kept chunks to a fresh encoder, announces them again and speaks on from the next
chunk (``tts.checkpoints``), so its audio is sample for sample the unkilled run's.

Across rungs: never. A text is spoken in one voice, and each rung is its own engine or voice
setting (ChatTTS on a GPU and on a CPU sample differently, Piper and espeak-ng are other engines),
so a checkpoint made on one rung is refused on another and the job speaks the text again from its
start there (the history says ``checkpoint_ignored``). On its own rung the engine also checks that
the voice, rate and chunking are still those of the checkpoint (a rung re-configured between two
attempts), and otherwise starts over, with a warning in the worker log.

Short texts start over: a text of at most :data:`SHORT_TEXT_CHARS` characters, which covers every
dialogue line (``dialogue.script.MAX_LINE_CHARS``), never writes a checkpoint; speaking it again
costs seconds.

Imported by the spec, so by every farm process: nothing heavy here.
"""

from __future__ import annotations

from mediafarm.tasks.kit import Checkpoint, Resume

# The engine's checkpoint state format (``tts.checkpoints``); another one is refused, recorded.
STATE_VERSION = 1
# Texts up to this long never checkpoint; the longest dialogue line is this long.
SHORT_TEXT_CHARS = 2_000


def _refuses(checkpoint: Checkpoint, rung: str) -> str | None:
    # Called only for the rung that made it (across_rungs=False): the state's format is the question.
    version = checkpoint.state.get("version")
    if version != STATE_VERSION:
        return f"its TTS state is of version {version!r}; this worker reads version {STATE_VERSION}"
    return None


RESUME = Resume(
    unit="characters",
    rule=(
        "from its last finished chunk, on the rung that made it (another rung is another voice: it starts over); "
        f"a text of {SHORT_TEXT_CHARS:,} characters or less (a dialogue line) starts over"
    ),
    across_rungs=False,
    refuses=_refuses,
)
