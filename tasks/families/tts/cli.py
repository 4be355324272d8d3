"""``farm speakers``: the TTS family's own commands (``FamilySpec.cli``), mounted by the farm's CLI.

Producer-side: plain Redis through the speaker store, no TTS package needed.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from mediafarm.tasks.families.tts.speakers import list_speakers, register_speaker, remove_speaker
from mediafarm.tasks.kit import get_settings

speakers = typer.Typer(name="speakers", no_args_is_help=True,
                       help="TTS speakers: one fixed voice per engine, kept in Redis.")  # fmt: skip
console = Console()
err = Console(stderr=True)


def _fail(message: str, code: int = 2) -> None:
    # As the farm's own commands say it: exit 2 for a refused input, 1 for nothing to act on.
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _need_broker() -> None:
    if not get_settings().broker_url:
        _fail("FARM_BROKER_URL is not set: point it at the farm's Redis (or run `farm demo`)")


@speakers.command("add")
def add(
    name: str,
    seed: Annotated[int | None, typer.Option(help="ChatTTS: sample the speaker embedding with this seed")] = None,
    embedding: Annotated[str | None, typer.Option(help="ChatTTS: the speaker embedding string itself")] = None,
    piper_voice: Annotated[str | None, typer.Option(help="Piper: voice .onnx under FARM_MODELS_DIR")] = None,
    piper_speaker: Annotated[int | None, typer.Option(help="Piper: speaker id of a multi-speaker voice")] = None,
    espeak_voice: Annotated[str | None, typer.Option(help="espeak-ng: voice and variant, e.g. en-us+m3")] = None,
    voice: Annotated[list[str] | None, typer.Option(
        help="A voice for jobs in one language, LANG:ENGINE=VOICE (engine: espeak, piper or piper-speaker), "
             "e.g. zh:espeak=cmn+f3 or de:piper=piper/de_DE-thorsten-medium.onnx; repeat it for more")] = None,
) -> None:
    """Register a speaker; the voices it does not name are chosen distinct from every other speaker's."""
    _need_broker()
    given: dict[str, Any] = {"seed": seed, "embedding": embedding, "piper_voice": piper_voice,
                             "piper_speaker": piper_speaker, "espeak_voice": espeak_voice}  # fmt: skip
    if voice:
        given["voices"] = _language_voices(voice)
    try:
        speaker = register_speaker(name, **{k: v for k, v in given.items() if v is not None})
    except ValueError as exc:
        _fail(str(exc))
    console.print(f"speaker [bold]{speaker.name}[/] registered (slot {speaker.slot})")


_VOICE_FIELDS = {"espeak": "espeak_voice", "piper": "piper_voice", "piper-speaker": "piper_speaker"}


def _language_voices(options: list[str]) -> dict[str, dict[str, Any]]:
    """``--voice zh:espeak=cmn+f3`` options as ``Speaker.voices`` (checked by the speaker model)."""
    voices: dict[str, dict[str, Any]] = {}
    for option in options:
        language, _, rest = option.partition(":")
        engine, _, value = rest.partition("=")
        if not language or engine not in _VOICE_FIELDS or not value:
            _fail(f"--voice {option!r}: give LANG:ENGINE=VOICE, ENGINE one of {', '.join(_VOICE_FIELDS)}")
        voices.setdefault(language, {})[_VOICE_FIELDS[engine]] = value
    return voices


@speakers.command("list")
def list_() -> None:
    """Every speaker and its voice on each engine."""
    _need_broker()
    table = Table("speaker", "slot", "ChatTTS", "Piper", "espeak-ng", "per language")
    for s in list_speakers():
        chattts = "stored embedding" if s.embedding else f"seed {s.chattts_seed}"
        piper = s.piper_voice or "rung's voice"
        piper += f" speaker {s.piper_speaker}" if s.piper_speaker is not None else f" pitch {s.piper_pitch:g}"
        languages = "; ".join(
            f"{lang}: " + ", ".join(f"{k} {v}" for k, v in voices.model_dump(exclude_none=True).items())
            for lang, voices in sorted(s.voices.items())
        )
        table.add_row(s.name, str(s.slot), chattts, piper, s.espeak, languages or "-")
    console.print(table)


@speakers.command("rm")
def rm(name: str) -> None:
    """Remove a registered speaker (jobs naming it are then rejected)."""
    _need_broker()
    try:
        removed = remove_speaker(name)
    except ValueError as exc:
        _fail(str(exc))
    if not removed:
        _fail(f"no speaker named {name!r}", code=1)
    console.print(f"speaker {name} removed")
