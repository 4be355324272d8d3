"""Re-render a finished subtitle job's cues with other rules: no new recognition, only new files."""

from mediafarm.tasks.families.subtitle_render.spec import FAMILY

__all__ = ["FAMILY"]
