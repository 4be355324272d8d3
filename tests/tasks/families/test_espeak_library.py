"""The espeak rung without the espeak-ng program: the tts extra's libespeak-ng wheel, through ctypes.

Every test runs on every machine. Where Debian's espeak-ng program is installed too, the ones that
compare the two also check the library against it (same voices, same audio for a phrase).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from mediafarm.tasks.families.tts import libespeak
from mediafarm.tasks.families.tts.espeak import EspeakVoice
from mediafarm.tasks.families.tts.languages import espeak_voice_for, espeak_voices
from mediafarm.tasks.kit import RungUnavailable

ABSENT = "espeak-ng-not-installed-here"  # a binary name no PATH has: the rung takes the library
PHRASE = "Good evening, everyone. The parcel is at the front door."


def _maps() -> list[str]:
    return [line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "espeak" in line]


def test_without_the_program_the_rung_speaks_through_the_wheels_library() -> None:
    import espeakng_loader

    voice = EspeakVoice(ABSENT, "en-us+m3", 1.0)
    assert voice.program is None and voice.label.startswith("libespeak-ng 1.") and voice.rate == 22050
    [audio] = voice.speak([PHRASE])
    assert audio.dtype == np.float32 and 2.0 < audio.size / voice.rate < 6.0 and 0.3 < np.abs(audio).max() <= 1.0
    wheel = Path(espeakng_loader.__file__).parent
    assert Path(libespeak.library().path).parent == wheel
    # Loaded by its path in the wheel, never Debian's libespeak-ng.so.1; unloaded after each call.
    with libespeak.library()._loaded():
        seen = _maps()
    assert seen and all(Path(p).parent == wheel for p in seen), seen
    assert _maps() == []


def test_the_rung_as_shipped_speaks_through_the_library_even_with_a_program_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An espeak-ng on PATH that says so if it is ever run: the default rung must not start it (a
    # process per chunk, and samples that differ from host to host with what is installed).
    from mediafarm.tasks.families.tts.spec import EspeakParams

    ran = tmp_path / "ran"
    program = tmp_path / "espeak-ng"
    program.write_text(f"#!/bin/sh\ntouch {ran}\nexit 1\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    params = EspeakParams()
    assert params.binary is None and shutil.which("espeak-ng") == str(program)
    voice = EspeakVoice(params.binary, "en-us", 1.0)
    assert voice.program is None and voice.label.startswith("libespeak-ng ")
    [audio] = voice.speak([PHRASE])
    assert audio.size > voice.rate
    espeak_voices.cache_clear()
    try:
        assert espeak_voices(params.binary) == libespeak.library().voices()
        assert espeak_voice_for(params.binary, "zh") == "cmn"
    finally:
        espeak_voices.cache_clear()
    assert not ran.exists()
    # Named, the program is what speaks (here it fails, and says so).
    named = EspeakVoice("espeak-ng", "en-us", 1.0)
    assert named.program == str(program)


def test_the_library_speaks_the_same_samples_every_call() -> None:
    # One library kept loaded drifts by a few samples a call (a static pitch-flutter index);
    # loaded afresh each call it speaks as a new program does.
    lib = libespeak.library()
    first = lib.synth(PHRASE, "en-us+m3", 175)
    lib.synth("Something else in between, in another voice.", "en-gb+f3", 220)
    assert all(np.array_equal(first, lib.synth(PHRASE, "en-us+m3", 175)) for _ in range(3))


def test_a_voice_with_noise_speaks_the_same_samples_in_every_process() -> None:
    # en-us+f3's breath noise came from a generator seeded by the clock: each process (each worker
    # child, each test session) spoke it differently until the binding seeded it.
    import hashlib
    import subprocess

    speak = (
        "import hashlib, sys; from mediafarm.tasks.families.tts.libespeak import library; "
        f"sys.stdout.write(hashlib.sha256(library().synth({PHRASE!r}, 'en-us+f3', 175).tobytes()).hexdigest())"
    )
    heard = {subprocess.run([sys.executable, "-c", speak], capture_output=True, text=True, check=True).stdout
             for _ in range(2)}  # fmt: skip
    here = hashlib.sha256(libespeak.library().synth(PHRASE, "en-us+f3", 175).tobytes()).hexdigest()
    assert heard == {here}


def test_the_library_lists_the_programs_voices_and_picks_the_same_voice_for_a_language() -> None:
    voices = libespeak.library().voices()
    names = {name for name, _ in voices}
    assert {"en-us", "en-gb", "cmn", "fr-fr", "de"} <= names and len(voices) > 100
    assert espeak_voice_for(ABSENT, "zh") == "cmn" and espeak_voice_for(ABSENT, "fr") == "fr-fr"
    program = shutil.which("espeak-ng")
    if program is not None:  # every voice of the program's, plus what the wheel's newer release added
        espeak_voices.cache_clear()
        listed = dict(espeak_voices("espeak-ng"))
        assert listed and set(listed) <= names
        # Aliases may move between releases (1.52 dropped es-419's "es"); the pick stays.
        for language in ("zh", "fr", "en", "de", "pt", "es"):
            assert espeak_voice_for(ABSENT, language) == espeak_voice_for("espeak-ng", language)


def test_library_and_program_give_one_voice_the_same_checks_and_a_phrase_alike() -> None:
    engines = [EspeakVoice(ABSENT, "en-us", 1.0)]
    if shutil.which("espeak-ng") is not None:
        engines.append(EspeakVoice("espeak-ng", "en-us", 1.0))
    spoken = [voice.speak([PHRASE]) for voice in engines]
    pieces = [voice.speak(["One sentence.", "And another one.", "A third."]) for voice in engines]
    for voice, [audio], cut in zip(engines, spoken, pieces, strict=True):
        assert voice.rate == 22050 and audio.dtype == np.float32 and len(cut) == 3
        assert all(p.size > 0.3 * voice.rate for p in cut)
        with pytest.raises(RungUnavailable, match="no voice 'xx-nowhere'"):
            EspeakVoice(ABSENT if voice.program is None else "espeak-ng", "xx-nowhere", 1.0).speak(["Hi."])
    if len(engines) == 2:  # the same voice and flags, releases apart: as long and as loud within 3 %
        (library,), (program,) = spoken
        rms = [float(np.sqrt(np.mean(a**2))) for a in (library, program)]
        assert library.size == pytest.approx(program.size, rel=0.03) and rms[0] == pytest.approx(rms[1], rel=0.03)


def test_without_the_wheel_the_rung_is_unavailable_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from mediafarm.tasks import registry

    espeak = registry.get("tts").engines["espeak"]
    assert espeak.missing() is None
    monkeypatch.setitem(sys.modules, "espeakng_loader", None)  # find_spec answers None: not installed
    assert espeak.missing() == "package 'espeakng_loader' is not installed on this pool: pip install 'mediafarm[tts]'"


def _prepared(lib: libespeak.Library, voice: str, timeout: float = 10.0) -> bool:
    """Has the thread after the last call prepared a library in ``voice``? (Waits for it.)"""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with lib._lock:
            if lib._ready is not None:
                return lib._ready[1] == voice
        time.sleep(0.01)
    return False


def test_a_library_prepared_after_a_call_speaks_the_next_one_sample_for_sample_as_a_fresh_one() -> None:
    lib = libespeak.library()
    with lib._loaded():  # whatever was prepared is gone: the next call loads afresh
        pass
    assert lib._ready is None
    fresh = lib.synth(PHRASE, "en-us+f3", 175)  # a voice with breath noise, from the seeded generator
    assert _prepared(lib, "en-us+f3")
    assert np.array_equal(lib.synth(PHRASE, "en-us+f3", 175), fresh)  # spoken by the prepared one
    assert _prepared(lib, "en-us+f3")
    faster = lib.synth(PHRASE, "en-us+f3", 220)  # another pace in the same voice: the prepared one too
    with lib._loaded():
        pass
    assert faster.size < 0.9 * fresh.size and np.array_equal(lib.synth(PHRASE, "en-us+f3", 220), faster)
    # Another voice unloads the prepared library first: one copy loaded, never two sharing state.
    lib.synth("Something else, in another voice.", "en-gb", 175)
    assert _prepared(lib, "en-gb")
    assert len(lib.voices()) > 100 and lib._ready is None  # the voice list too starts from a fresh library
    assert np.array_equal(lib.synth(PHRASE, "en-us+f3", 175), fresh)
    assert _prepared(lib, "en-us+f3") and _maps()
    with lib._loaded():
        pass
    assert _maps() == []  # the prepared copy was unloaded, not left behind by the one loaded after it


def test_a_fork_waits_for_the_preparing_thread_and_the_child_speaks_alike() -> None:
    # A child forked while the preparing thread was inside dlopen would inherit the loader's lock
    # held and hang at its own first dlopen; the fork waits for the library's lock instead.
    import threading
    import time

    lib = libespeak.library()
    here = lib.synth(PHRASE, "en-us", 175)
    held, release = threading.Event(), threading.Event()

    def prepare_slowly() -> None:  # stands in for a preparing thread caught mid-dlopen
        with lib._lock:
            held.set()
            release.wait(10)

    threading.Thread(target=prepare_slowly, daemon=True).start()
    assert held.wait(10)
    threading.Timer(0.3, release.set).start()
    read, write = os.pipe()
    asked = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: speak (with the copy prepared before the fork, or afresh), report, exit
        try:
            os.close(read)
            same = np.array_equal(libespeak.library().synth(PHRASE, "en-us", 175), here)
            os.write(write, b"same" if same else b"differs")
        finally:
            os._exit(0)
    waited = time.monotonic() - asked
    os.close(write)
    import select

    ready, _, _ = select.select([read], [], [], 30)
    answer = os.read(read, 16) if ready else b"hung"
    os.close(read)
    if not ready:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    assert waited >= 0.25, "the fork went ahead while the library's lock was held"
    assert answer == b"same"
