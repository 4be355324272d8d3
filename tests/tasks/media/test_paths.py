import os
from pathlib import Path

import pytest

from mediafarm.tasks.wire.errors import MediaNotFound, MediaOutsideRoots, PermanentFailure
from mediafarm.tasks.wire.media_paths import resolve_media


@pytest.fixture()
def roots(tmp_path: Path) -> list[Path]:
    root = tmp_path / "media"
    root.mkdir()
    (root / "clip.wav").write_bytes(b"RIFF....")
    (tmp_path / "secret.wav").write_bytes(b"RIFF....")
    return [root]


def test_inside_root_absolute_and_relative(roots: list[Path]) -> None:
    real = (roots[0] / "clip.wav").resolve()
    assert resolve_media(str(roots[0] / "clip.wav"), roots) == real
    assert resolve_media("clip.wav", roots) == real


def test_dotdot_escape_is_refused(roots: list[Path]) -> None:
    with pytest.raises(MediaOutsideRoots, match="outside the media roots"):
        resolve_media(str(roots[0] / ".." / "secret.wav"), roots)
    with pytest.raises(MediaOutsideRoots):
        resolve_media("../secret.wav", roots)


def test_symlink_pointing_out_is_refused(roots: list[Path]) -> None:
    link = roots[0] / "link.wav"
    os.symlink(roots[0].parent / "secret.wav", link)
    with pytest.raises(MediaOutsideRoots, match="secret.wav"):
        resolve_media(str(link), roots)


def test_symlinked_root_prefix_trick_is_refused(roots: list[Path], tmp_path: Path) -> None:
    # /tmp/x/media-evil shares a string prefix with /tmp/x/media but is another folder.
    evil = tmp_path / "media-evil"
    evil.mkdir()
    (evil / "a.wav").write_bytes(b"x")
    with pytest.raises(MediaOutsideRoots):
        resolve_media(str(evil / "a.wav"), roots)


def test_missing_empty_directory_and_junk(roots: list[Path]) -> None:
    with pytest.raises(MediaNotFound, match="not found"):
        resolve_media("nope.wav", roots)
    (roots[0] / "empty.wav").write_bytes(b"")
    with pytest.raises(PermanentFailure, match="empty"):
        resolve_media("empty.wav", roots)
    (roots[0] / "dir").mkdir()
    with pytest.raises(PermanentFailure, match="not a regular file"):
        resolve_media("dir", roots)
    for bad in ("", "  ", "a\x00b"):
        with pytest.raises(PermanentFailure):
            resolve_media(bad, roots)


def test_names_the_file_system_cannot_look_up_are_bad_input(roots: list[Path]) -> None:
    # ENAMETOOLONG and a loop of links: refused as bad input, the long path shortened in the reason.
    with pytest.raises(PermanentFailure, match=r"cannot be looked up: File name too long: .*\(4,5\d\d characters\)"):
        resolve_media("deep/" * 900 + "x.wav", roots)
    with pytest.raises(PermanentFailure, match=r"cannot be looked up: File name too long"):
        resolve_media("y" * 300 + ".wav", roots)
    os.symlink(roots[0] / "loop-b", roots[0] / "loop-a")
    os.symlink(roots[0] / "loop-a", roots[0] / "loop-b")
    with pytest.raises(PermanentFailure, match=r"cannot be looked up: .*loop"):
        resolve_media("loop-a", roots)
