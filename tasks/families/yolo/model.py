"""YOLO models through ultralytics, offline, loaded once per pool child.

ultralytics reaches for the network in several places: a DNS probe at import (``is_online``),
settings sync and analytics events, pip auto-install of missing requirements (onnx, onnxruntime)
and a font download when anything plots. :func:`ultralytics_offline` switches each off before the
first ``import ultralytics`` (the switches are read at import time) and gives it a writable,
private config folder. Weights come only from the models dir; an absent or unloadable file makes
the rung unavailable, never a download.

``.pt`` weights run on torch (on the GPU with the pool's memory fraction, ``tasks.runtime.gpu``); ``.onnx``
exports run through onnxruntime, which ultralytics drives itself, at the size they were exported
with.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from mediafarm.tasks.kit import InvalidRequest, RungUnavailable, raise_if_out_of_memory, torch_device

log = logging.getLogger(__name__)

def _config_dir() -> Path:
    # Not the storage folder: `farm gc` owns what is there. Per user, so two users never share one.
    return Path(tempfile.gettempdir()) / f"mediafarm-ultralytics-{os.getuid()}"


@functools.lru_cache(maxsize=1)
def ultralytics_offline() -> Any:
    """Import ultralytics with every network path switched off; returns the module.

    Raises:
        RuntimeError: ultralytics was imported earlier in this process without the switches (a
            bug: its module-level flags are already set, and could call out).
    """
    if "ultralytics" in sys.modules:
        utils = sys.modules["ultralytics.utils"]
        if utils.ONLINE or utils.AUTOINSTALL:
            raise RuntimeError("ultralytics was imported before the farm switched it offline")
    os.environ["YOLO_OFFLINE"] = "1"  # no DNS probe at import; ONLINE is False
    os.environ["YOLO_AUTOINSTALL"] = "False"  # a missing requirement fails instead of pip-installing
    config = Path(os.environ.setdefault("YOLO_CONFIG_DIR", str(_config_dir())))
    config.mkdir(parents=True, exist_ok=True)
    _place_font(config)
    import ultralytics
    from ultralytics.utils import SETTINGS

    SETTINGS.update(sync=False)  # no analytics events, whatever the settings file said
    return ultralytics


def _place_font(config: Path) -> None:
    # The farm never plots, but ultralytics' check_font downloads Arial.ttf into the config folder
    # the moment anything draws a box; matplotlib ships a TTF that serves as well.
    target = config / "Arial.ttf"
    if target.exists():
        return
    try:
        import matplotlib
    except ImportError:  # without matplotlib ultralytics cannot plot either
        return
    source = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    if source.is_file():
        shutil.copyfile(source, target)


@dataclass(frozen=True)
class Hit:
    """One detection: class id, confidence, box ``(x1, y1, x2, y2)`` in the input image's pixels."""

    cls: int
    confidence: float
    box: tuple[float, float, float, float]


class Detector:
    """A loaded YOLO model and the arguments every call uses.

    Attributes:
        names: Class id → name, as the weights declare them.
        label: The model, runtime and versions, for the job's result.
        calls, seconds: Model calls made and their wall time (pre- and post-processing included).
    """

    def __init__(self, yolo: Any, *, weights: Path, device: str, label: str) -> None:
        self.yolo, self.weights, self.device, self.label = yolo, weights, device, label
        self.names: dict[int, str] = dict(yolo.names)
        self.calls, self.seconds = 0, 0.0

    def class_ids(self, wanted: Sequence[str]) -> list[int]:
        """The ids of ``wanted`` class names; InvalidRequest naming the unknown ones."""
        by_name = {name: i for i, name in self.names.items()}
        unknown = [name for name in wanted if name not in by_name]
        if unknown:
            known = sorted(by_name)
            shown = ", ".join(known[:20]) + (f" ... ({len(known)} in all)" if len(known) > 20 else "")
            raise InvalidRequest(
                f"yolo request: classes {unknown} are not classes of {self.weights.name}; it knows: {shown}"
            )
        return [by_name[name] for name in wanted]

    def detect(self, image: np.ndarray, *, classes: Sequence[int], conf: float, imgsz: int | None) -> list[Hit]:
        """Detections of ``classes`` in one BGR image."""
        options: dict[str, Any] = {"conf": conf, "classes": list(classes), "device": self.device, "verbose": False,
                                   "save": False, "show": False}  # fmt: skip
        if imgsz is not None:
            options["imgsz"] = imgsz
        started = time.perf_counter()
        try:
            [result] = self.yolo.predict(image, **options)
        finally:
            self.seconds += time.perf_counter() - started
            self.calls += 1
        boxes = result.boxes
        if boxes is None or len(boxes) == 0:
            return []
        xyxy = boxes.xyxy.cpu().numpy().tolist()
        return [Hit(int(c), float(p), tuple(b)) for c, p, b in
                zip(boxes.cls.cpu().tolist(), boxes.conf.cpu().tolist(), xyxy, strict=True)]  # fmt: skip

    def ms_per_call(self) -> float | None:
        return round(1000 * self.seconds / self.calls, 2) if self.calls else None


def _limit_onnx_threads(yolo: Any, weights: Path, threads: int) -> None:
    """Reopen the ONNX session ultralytics made on the warm-up call with ``threads`` intra-op threads.

    ultralytics opens it with onnxruntime's default, one thread per core, and passes no session
    options through ``YOLO``: in a pool of one child per core every child would take every core
    (Piper did the same, and two children ran slower than one: see the dialogue benchmark). Only a
    CPU session is reopened (no IO binding to redo); the session's model, inputs and outputs are
    the same, so the backend's other fields still hold. An ultralytics whose backend is not where
    this looks keeps its default, said in the log.
    """
    backend = getattr(getattr(getattr(yolo, "predictor", None), "model", None), "backend", None)
    session = getattr(backend, "session", None)
    if session is None or session.get_providers()[:1] != ["CPUExecutionProvider"]:
        log.warning("ultralytics %s: no CPU onnxruntime session found to give %d threads; it keeps "
                    "onnxruntime's default (one per core)", version("ultralytics"), threads)  # fmt: skip
        return
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    backend.session = onnxruntime.InferenceSession(str(weights), options, providers=["CPUExecutionProvider"])


def load_detector(weights: Path, device: str, threads: int = 1) -> Detector:
    """The model in ``weights`` on ``device`` (``cpu`` or ``cuda``), loaded once per child.

    Raises:
        RungUnavailable: CUDA is not usable here, or the file cannot be loaded (corrupt, wrong
            format, its runtime missing).
        ResourceFailure: out of (GPU) memory while loading.
    """
    detector = _load(Path(weights).resolve(), device, threads)
    detector.calls, detector.seconds = 0, 0.0  # counters are per job; the model is per child
    return detector


# One model per child: a child's memory cap is sized for one, and loading the next (a smaller
# rung after an OOM, in the same child) drops this one.
@functools.lru_cache(maxsize=1)
def _load(weights: Path, device: str, threads: int) -> Detector:
    ultralytics = ultralytics_offline()
    runtime = "onnxruntime" if weights.suffix == ".onnx" else "torch"
    if device == "cuda":
        if runtime == "onnxruntime":
            raise RungUnavailable("ONNX weights run on CPU rungs here; give a cuda rung .pt weights")
        device = torch_device()  # the pool's GPU memory fraction, applied once per child
    try:
        yolo = ultralytics.YOLO(str(weights), task="detect")
        # An export is opened lazily, on the first call: make it now, so that a corrupt file is
        # this rung being unavailable and not a failure in the middle of a job.
        yolo.predict(np.zeros((64, 64, 3), np.uint8), device=device, verbose=False, save=False)
        if runtime == "onnxruntime":
            _limit_onnx_threads(yolo, weights, threads)
        if runtime == "torch" and device == "cpu":
            # Set after the first predict: it resets torch's threads to min(8, cores - 1)
            # (select_device), whatever was set before: every child of a 16-core pool would take 8
            # (bench/yolo.py --sizes found it). Later calls reuse the predictor and leave them.
            import torch

            torch.set_num_threads(threads)
    except Exception as exc:  # noqa: BLE001 - ultralytics raises anything from a bad file
        raise_if_out_of_memory(exc, device, f"loading {weights.name}")
        raise RungUnavailable(f"ultralytics cannot load {weights.name}: {type(exc).__name__}: {exc}") from exc
    versions = f"ultralytics {version('ultralytics')}, {runtime} {version(runtime)}"
    return Detector(yolo, weights=weights, device=device, label=f"{weights.name} ({versions}, {device})")
