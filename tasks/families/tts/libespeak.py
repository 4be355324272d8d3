"""libespeak-ng from the ``espeakng-loader`` wheel, through ctypes: espeak-ng with no program installed.

The wheel (the tts extra) carries the shared library and its voice data; this module calls the
same functions, with the same flags, as the ``espeak-ng`` program does for ``--stdin --stdout``
(``src/espeak-ng.c``): ``espeak_SetVoiceByName`` (then by language, as the program falls back),
``espeakRATE``, and ``espeak_Synth`` with ``espeakCHARS_AUTO | espeakPHONEMES | espeakENDPAUSE``
(``| espeakSSML`` for ``-m``). So a voice name means the same voice either way, and the voice list
is the one ``espeak-ng --voices`` prints (the wheel's release may add voices to it).

The same text in the same voice gives the same samples on every call and in every process. Two
things stood in the way. The library seeds its noise generator from the clock, so it is seeded
again after each initialisation (:data:`RAND_SEED`). And libespeak-ng keeps state no API resets
(a function-static pitch-flutter index in its wave generator, which ``espeak_Terminate`` and a
new ``espeak_Initialize`` leave as it was), so one library kept loaded speaks a sentence a few
samples differently each time it is asked (found by the test that a speaker's audio is
bit-identical across jobs). Each call therefore speaks with a library freshly loaded, initialised
and given its voice, and unloads it (``dlclose``) after. Those steps take 2.5 ms of a sentence's 7
(the voice's files most of it), so they are done for the next call as soon as a call ends, in a
thread (:meth:`Library._prepare`), in the voice just used: a next call in that voice (a job's next
chunk, the narrator's next line) starts speaking at once; one in another voice unloads the
prepared library and loads afresh. Should something else in the process hold the same library
open, it is not unloaded and that guarantee is lost; nothing in the farm does.

The library is loaded by its absolute path inside the wheel, never by soname: a machine with
Debian's ``libespeak-ng1`` must still get the wheel's library and data. Its state is global (one
voice, one callback, one synthesis at a time, one copy loaded), so every call, the preparation
included, holds a lock.

Light: ctypes only (every farm process imports the spec that lists the voices), numpy only in
:meth:`Library.synth`, the farm's error tree only when an error is raised (the tests' espeak-ng
stand-in program loads this module alone, once per call).
"""

from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Iterator
from typing import Any

# espeak_AUDIO_OUTPUT: samples handed to the callback, synth returns when done.
AUDIO_OUTPUT_SYNCHRONOUS = 2
# Report errors instead of calling exit() inside the library (a worker must never exit there).
INITIALIZE_DONT_EXIT = 0x8000
POS_CHARACTER = 1
RATE_PARAMETER = 1  # espeakRATE: words a minute
# The program's own synth flags: espeakCHARS_AUTO | espeakPHONEMES | espeakENDPAUSE; -m adds espeakSSML.
SYNTH_FLAGS = 0x0000 | 0x0100 | 0x1000
SSML = 0x10
EE_OK = 0
# Voices with breath or flutter noise (``en-us+f3``) draw it from the library's own generator,
# seeded from the clock at initialisation: the same sentence came out different in every process.
# A fixed seed, set after each initialisation, makes it the same in every process and on every host.
RAND_SEED = 1


class _Voice(ctypes.Structure):
    # espeak_VOICE; ``languages`` is a run of (priority byte, NUL-terminated code) ended by a 0 byte,
    # so it is read as a raw pointer, not as a C string.
    _fields_ = [
        ("name", ctypes.c_char_p), ("languages", ctypes.c_void_p), ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte), ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte), ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int), ("spare", ctypes.c_void_p),
    ]  # fmt: skip


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class Library:
    """The wheel's libespeak-ng. Attributes: path (the .so loaded), rate (Hz), version."""

    def __init__(self) -> None:
        import espeakng_loader  # the espeak engine's needs name it: a pool without it never gets here
        self.path, self._data = espeakng_loader.get_library_path(), espeakng_loader.get_data_path().encode()
        self._lock, self._chunks = threading.Lock(), []  # type: list[bytes]
        self._ready: tuple[ctypes.CDLL, str] | None = None  # prepared for the next call (_prepare)
        # A fork waits for the preparing thread: a child forked while that thread held the dynamic
        # loader's lock, in dlopen, would hang at its own first dlopen.
        os.register_at_fork(before=self._lock.acquire, after_in_parent=self._lock.release,
                            after_in_child=self._lock.release)  # fmt: skip
        # Kept on the object: the library holds only the pointer, a collected callback would crash it.
        self._callback = _CALLBACK(self._collect)
        with self._loaded() as lib:
            self.version = (lib.espeak_Info(None) or b"").decode()

    @contextlib.contextmanager
    def _loaded(self) -> Iterator[ctypes.CDLL]:
        """The library freshly loaded and initialised, unloaded on the way out (module docstring)."""
        with self._lock:
            lib = self._open()
            try:
                yield lib
            finally:
                self._close(lib)

    def _open(self) -> ctypes.CDLL:
        """A fresh library, initialised and seeded (the lock held). A prepared one is unloaded
        first: the same path opened twice is one library, and its state would be shared."""
        self._discard_ready()
        lib = ctypes.CDLL(self.path)
        try:
            _declare(lib)
            self.rate = lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, self._data, INITIALIZE_DONT_EXIT)
            lib.espeak_ng_SetRandSeed(RAND_SEED)
            if self.rate <= 0:
                from mediafarm.tasks.kit import RungUnavailable

                raise RungUnavailable(f"libespeak-ng at {self.path} did not initialise (returned {self.rate})")
            lib.espeak_SetSynthCallback(self._callback)
        except BaseException:
            _ctypes.dlclose(lib._handle)
            raise
        return lib

    @staticmethod
    def _close(lib: ctypes.CDLL) -> None:
        try:
            lib.espeak_Terminate()
        finally:
            _ctypes.dlclose(lib._handle)

    def _discard_ready(self) -> None:
        ready, self._ready = self._ready, None
        if ready is not None:
            self._close(ready[0])

    def _with_voice(self, voice: str) -> ctypes.CDLL:
        """The library for one call in ``voice`` (the lock held): the one prepared for it after the
        last call, else a fresh one with the voice set, as the program sets it."""
        if self._ready is not None and self._ready[1] == voice:
            lib, self._ready = self._ready[0], None
            return lib
        lib = self._open()
        if not _set_voice(lib, voice):
            self._close(lib)
            from mediafarm.tasks.kit import RungUnavailable

            raise RungUnavailable(f"espeak-ng has no voice {voice!r} (libespeak-ng {self.version})")
        return lib

    def _prepare(self, voice: str) -> None:
        """Load, initialise and set ``voice`` for the next call, off the caller's path (a thread
        started after each call): a next call in the same voice starts speaking at once. The
        steps and their order are a fresh call's, so its samples are the same; a call in another
        voice unloads this one and starts afresh."""
        try:
            with self._lock:
                if self._ready is not None:
                    return
                lib = self._open()
                if _set_voice(lib, voice):
                    self._ready = (lib, voice)
                else:
                    self._close(lib)
        except Exception:  # noqa: BLE001 - only a head start: the next call loads as it always did
            pass

    def voices(self) -> tuple[tuple[str, tuple[tuple[str, int], ...]], ...]:
        """(voice, its (language code, priority) pairs) in the library's order, as ``espeak-ng --voices``
        lists them: the voice is named by its first language code, the name ``-v`` takes."""
        listed = []
        with self._loaded() as lib:
            entries = lib.espeak_ListVoices(None)
            for i in range(10_000):
                if not entries[i]:
                    break
                codes, at = [], entries[i].contents.languages
                while (priority := ctypes.string_at(at, 1)[0]) != 0:
                    code = ctypes.string_at(at + 1)
                    codes.append((code.decode(), priority))
                    at += len(code) + 2
                if codes:
                    listed.append((codes[0][0], tuple(codes)))
        return tuple(listed)

    def synth(self, text: str, voice: str, wpm: int, ssml: bool = False) -> Any:
        """``text`` spoken by ``voice`` at ``wpm``: int16 numpy samples at :attr:`rate`."""
        import numpy as np

        with self._lock:
            lib = self._with_voice(voice)
            try:
                lib.espeak_SetParameter(RATE_PARAMETER, wpm, 0)
                data = text.encode("utf-8")
                self._chunks = []
                flags = SYNTH_FLAGS | (SSML if ssml else 0)
                status = lib.espeak_Synth(data, len(data) + 1, 0, POS_CHARACTER, 0, flags, None, None)
                if status == EE_OK:
                    status = lib.espeak_Synchronize()
                chunks, self._chunks = self._chunks, []
            finally:
                self._close(lib)
        threading.Thread(target=self._prepare, args=(voice,), name="libespeak-prepare", daemon=True).start()
        if status != EE_OK:
            raise RuntimeError(f"libespeak-ng failed to speak (espeak_ERROR {status})")
        return np.frombuffer(b"".join(chunks), dtype=np.int16)

    def _collect(self, wav: Any, count: int, events: Any) -> int:
        if wav and count > 0:
            self._chunks.append(ctypes.string_at(wav, count * 2))
        return 0  # go on


def _set_voice(lib: ctypes.CDLL, voice: str) -> bool:
    """``voice`` by name, else by language, as the program falls back; False if neither is known."""
    if lib.espeak_SetVoiceByName(voice.encode()) == EE_OK:
        return True
    wanted = _Voice(languages=ctypes.cast(ctypes.c_char_p(voice.encode()), ctypes.c_void_p))
    return lib.espeak_SetVoiceByProperties(ctypes.byref(wanted)) == EE_OK


def _declare(lib: ctypes.CDLL) -> None:
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_Info.restype, lib.espeak_Info.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
    lib.espeak_ListVoices.argtypes = [ctypes.c_void_p]
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetVoiceByProperties.argtypes = [ctypes.POINTER(_Voice)]
    lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                 ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
    lib.espeak_SetSynthCallback.argtypes = [_CALLBACK]
    lib.espeak_ng_SetRandSeed.argtypes, lib.espeak_ng_SetRandSeed.restype = [ctypes.c_long], None


@functools.lru_cache(maxsize=1)
def library() -> Library:
    """This process's libespeak-ng (found on first use, in the child that speaks)."""
    return Library()
