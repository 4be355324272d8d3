"""The camera filter: VAD ∥ YOLO on a recording, then its clips (``spec``, ``plan``, ``cut``, ``engines``)."""

from mediafarm.tasks.families.camfilter.spec import FAMILY

__all__ = ["FAMILY"]
