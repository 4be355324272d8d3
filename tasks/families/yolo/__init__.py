"""The YOLO family: object detection intervals in a video or image (ultralytics, motion-gated)."""

from mediafarm.tasks.families.yolo.spec import FAMILY

__all__ = ["FAMILY"]
