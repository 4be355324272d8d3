"""espeak-ng for the tests, from the wheel the tts extra installs (``espeakng-loader``), never a program.

- :func:`speak_wave`: speech the tests measure against (VAD spans, subtitle words), spoken by the
  wheel's libespeak-ng through the farm's own binding, so every machine makes the same test audio
  whether or not Debian's espeak-ng is installed.
- :data:`PROGRAM`: a command that answers as the ``espeak-ng`` program does for the calls the farm
  makes (``--version``, ``--voices``, ``-m -v VOICE -s WPM --stdin --stdout``; ``-w FILE TEXT``),
  speaking through the same library. The tests' gate scripts (a program that holds a line, so a
  test can kill it mid-job) run it where they once ran Debian's espeak-ng.

Run as a program, this file loads only the binding module (not the farm's packages, whose imports
cost most of a second a call; a gate runs once per chunk).
"""

from __future__ import annotations

import importlib.util
import io
import shlex
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve()
BINDING = HERE.parents[2] / "tasks" / "families" / "tts" / "libespeak.py"
# The stand-in espeak-ng as one shell word list: this interpreter running this file.
PROGRAM = f"{shlex.quote(sys.executable)} {shlex.quote(str(HERE))}"


def _binding() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_farm_libespeak", BINDING)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def speak_wave(text: str, voice: str = "en", wpm: int = 175):  # -> (np.ndarray float32, int)
    """``text`` in ``voice`` at ``wpm`` words a minute: (float32 samples, rate), as ``espeak-ng -w``
    would write them and libsndfile read them back. ``en`` is the voice the program speaks when
    given none (its ``default``, which the library does not know by that name)."""
    import numpy as np

    from mediafarm.tasks.families.tts.libespeak import library

    lib = library()
    return lib.synth(text, voice, wpm).astype(np.float32) / np.float32(32768.0), lib.rate


def hold_script(path: Path, hold_s: float, *, when: str | None = "Patience") -> Path:
    """An executable at ``path`` that speaks as espeak-ng does (:data:`PROGRAM`), holding ``hold_s``
    seconds first when the text on its stdin says ``when`` (every call when None)."""
    hold = f"sleep {hold_s:g}\n" if when is None else f'case "$text" in *{when}*) sleep {hold_s:g};; esac\n'
    path.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --version|--voices*) exec {PROGRAM} "$@";; esac\n'
        "text=$(cat)\n"
        f"{hold}"
        f"printf '%s' \"$text\" | exec {PROGRAM} \"$@\"\n"
    )
    path.chmod(0o755)
    return path


def main(argv: list[str]) -> int:
    lib_module = _binding()
    lib = lib_module.library()
    voice, wpm, ssml, out, text = "en", 175, False, None, None  # the program's "default" is en
    args = iter(argv)
    for arg in args:
        if arg == "--version":
            print(f"eSpeak NG text-to-speech: {lib.version}  Data at: {Path(lib.path).parent / 'espeak-ng-data'}")
            return 0
        if arg == "--voices":
            print("Pty Language       Age/Gender VoiceName          File                 Other Languages")
            for name, codes in lib.voices():
                others = "".join(f"({code} {priority})" for code, priority in codes[1:])
                print(f"{codes[0][1]:2d}  {name:<15} --/-      {name:<18} {name:<20} {others}")
            return 0
        if arg == "-v":
            voice = next(args)
        elif arg == "-s":
            wpm = int(next(args))
        elif arg == "-m":
            ssml = True
        elif arg == "-w":
            out = next(args)
        elif arg in ("--stdin", "--stdout"):
            pass
        else:
            text = arg
    if text is None:
        text = sys.stdin.buffer.read().decode("utf-8")
    import soundfile as sf

    try:
        samples = lib.synth(text, voice, wpm, ssml=ssml)
    except Exception as exc:  # noqa: BLE001 - said on stderr as the program says it, exit 2 or 1
        print(f"Failed to read voice '{voice}': {exc}" if "voice" in str(exc) else str(exc), file=sys.stderr)
        return 2 if "voice" in str(exc) else 1
    if out is not None:
        sf.write(out, samples, lib.rate, subtype="PCM_16")
    else:
        buffer = io.BytesIO()
        sf.write(buffer, samples, lib.rate, subtype="PCM_16", format="WAV")
        sys.stdout.buffer.write(buffer.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
