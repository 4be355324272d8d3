"""Input paths: every input must resolve, symlinks followed, inside one of the media roots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mediafarm.tasks.wire.errors import MediaNotFound, MediaOutsideRoots, PermanentFailure


def resolve_media(path: str, roots: Sequence[Path]) -> Path:
    """The real path of an input file, checked against the media roots.

    A relative path is taken relative to the first root. ``..`` and symlinks are resolved
    before the check, so neither can reach outside the roots.
    """
    if not isinstance(path, str) or not path.strip():
        raise PermanentFailure(f"media path must be a non-empty string, got {path!r}")
    if "\x00" in path:
        raise PermanentFailure("media path contains a NUL byte")
    if not roots:
        raise PermanentFailure("no media roots are configured (FARM_MEDIA_ROOTS)")
    try:
        return _resolved(path, roots)
    except (OSError, RuntimeError) as exc:
        # A name the file system cannot hold (a part over 255 bytes, a path over 4096: ENAMETOOLONG)
        # or a loop of links (RuntimeError before Python 3.13): bad input, not an engine error
        # (found by the malformed-input battery).
        shown = path if len(path) <= 200 else f"{path[:120]}...{path[-60:]} ({len(path):,} characters)"
        reason = getattr(exc, "strerror", None) or str(exc)
        raise PermanentFailure(f"media path cannot be looked up: {reason}: {shown!r}") from None


def _resolved(path: str, roots: Sequence[Path]) -> Path:
    given = Path(path)
    candidate = given if given.is_absolute() else Path(roots[0]) / given
    real = candidate.resolve(strict=False)
    real_roots = [Path(r).resolve(strict=False) for r in roots]
    if not any(real.is_relative_to(root) for root in real_roots):
        raise MediaOutsideRoots(
            f"{path!r} resolves to {str(real)!r}, outside the media roots "
            f"{[str(r) for r in real_roots]} (FARM_MEDIA_ROOTS)"
        )
    if not real.exists():
        raise MediaNotFound(f"media file not found: {path!r}")
    if not real.is_file():
        raise PermanentFailure(f"media path is not a regular file: {path!r}")
    if real.stat().st_size == 0:
        raise PermanentFailure(f"media file is empty (0 bytes): {path!r}")
    return real
