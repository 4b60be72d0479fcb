"""`analyze`: images, folders or videos → one JSON line per image or frame, and a summary line on stderr.

Folders laid out as `<emotion>/<file>`, or holding a `labels.csv` (file,emotion), give an accuracy figure: the
prediction for an image is the emotion of its largest face (or of the crop itself with --cropped).
"""

from __future__ import annotations

import csv
import json
import logging
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from pipeline.config.app import AppConfig
from pipeline.core.types import EMOTIONS, Detection, FaceResult
from pipeline.inference.perception import Perception
from pipeline.outputs.events import face_json

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}
VIDEO_SUFFIXES = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg"}


@dataclass
class Summary:
    images: int = 0
    frames: int = 0
    faces: int = 0
    unreadable: list[str] = field(default_factory=list)
    emotions: Counter[str] = field(default_factory=Counter)
    faces_per_image: Counter[int] = field(default_factory=Counter)
    labelled: int = 0
    correct: int = 0
    stage_ms: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        analysed = self.images + self.frames
        out: dict[str, object] = {
            "images": self.images, "frames": self.frames, "faces": self.faces,
            "faces_per_image": {str(k): v for k, v in sorted(self.faces_per_image.items())},
            "emotions": {e: self.emotions[e] for e in EMOTIONS},
            "seconds": round(self.seconds, 2),
            "per_second": round(analysed / self.seconds, 1) if self.seconds else None,
            "stage_ms_mean": {k: round(v / max(analysed, 1), 2) for k, v in self.stage_ms.items()},
        }
        if self.labelled:
            out["labelled"] = self.labelled
            out["accuracy"] = round(self.correct / self.labelled, 4)
        if self.unreadable:
            out["unreadable"] = self.unreadable
        return out


def _labels_for(folder: Path) -> dict[str, str]:
    table = folder / "labels.csv"
    if not table.is_file():
        return {}
    with table.open(newline="", encoding="utf-8") as handle:
        return {row["file"]: row["emotion"] for row in csv.DictReader(handle) if row.get("emotion") in EMOTIONS}


def _label_of(path: Path, labels: dict[str, str]) -> str | None:
    if path.name in labels:
        return labels[path.name]
    return path.parent.name if path.parent.name in EMOTIONS else None


def iter_inputs(paths: list[Path]) -> Iterator[tuple[Path, str | None]]:
    """Every image or video named, folders walked recursively in sorted order, with its label if known."""
    for path in paths:
        if path.is_dir():
            labels: dict[Path, dict[str, str]] = {}
            for child in sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES | VIDEO_SUFFIXES):
                table = labels.setdefault(child.parent, _labels_for(child.parent))
                yield child, _label_of(child, table)
        else:
            yield path, _label_of(path, _labels_for(path.parent)) if path.exists() else None


def _prefetched_frames(path: Path, every: int, depth: int = 8) -> Iterator[tuple[int, np.ndarray]]:
    """Decode on a background thread (OpenCV releases the GIL) so decoding overlaps inference."""
    frames: queue.Queue[tuple[int, np.ndarray] | None] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def decode() -> None:
        cap = cv2.VideoCapture(str(path))
        index = -1
        try:
            while not stop.is_set():
                if not cap.grab():
                    break
                index += 1
                if index % every:
                    continue
                ok, frame = cap.retrieve()
                if not ok:
                    break
                frames.put((index, frame))
        finally:
            cap.release()
            frames.put(None)

    reader = threading.Thread(target=decode, name=f"decode-{path.name}", daemon=True)
    reader.start()
    try:
        while (item := frames.get()) is not None:
            yield item
    finally:
        stop.set()
        while reader.is_alive():  # unblock a reader waiting on a full queue
            try:
                frames.get(timeout=0.1)
            except queue.Empty:
                pass


class Analyzer:
    def __init__(self, perception: Perception, cropped: bool, every: int) -> None:
        self.perception = perception
        self.cropped = cropped
        self.every = max(1, every)
        self.summary = Summary()

    def image(self, path: Path, label: str | None) -> None:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            self.summary.unreadable.append(str(path))
            log.error("%s: unreadable image (not an image, or corrupt)", path)
            return
        self.summary.images += 1
        faces = self._faces(image)
        self._emit({"source": str(path), "frame": 0}, faces, label)

    def video(self, path: Path) -> None:
        frames = _prefetched_frames(path, self.every)
        read_any = False
        for index, frame in frames:
            read_any = True
            self.summary.frames += 1
            self._emit({"source": str(path), "frame": index}, self._faces(frame), None)
        if not read_any:
            self.summary.unreadable.append(str(path))
            log.error("%s: unreadable video (unsupported format, corrupt or empty)", path)

    def _faces(self, image: np.ndarray) -> list[FaceResult]:
        if self.cropped:
            classifier = self.perception.classifier
            t0 = time.monotonic()
            scores = classifier.classify([classifier.crop_from_still(image)])[0]
            self.summary.stage_ms["emotion"] += (time.monotonic() - t0) * 1e3
            height, width = image.shape[:2]
            box = Detection((0.0, 0.0, float(width), float(height)), 1.0, np.zeros((5, 2), np.float32))
            return [FaceResult(box, scores)]
        faces, scores, timings = self.perception.analyze(image)
        self.summary.stage_ms.update(timings)
        return [FaceResult(face, score) for face, score in zip(faces, scores)]

    def _emit(self, head: dict[str, object], faces: list[FaceResult], label: str | None) -> None:
        self.summary.faces += len(faces)
        self.summary.faces_per_image[len(faces)] += 1
        for face in faces:
            self.summary.emotions[face.scores.emotion] += 1
        if label is not None:
            self.summary.labelled += 1
            if faces and max(faces, key=lambda f: f.detection.area).scores.emotion == label:
                self.summary.correct += 1
        record = dict(head, faces=[face_json(f, with_track=False) for f in faces])
        if label is not None:
            record["label"] = label
        sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")


def _for_analyze(cfg: AppConfig, crop: str | None, detector_input: tuple[int, int] | None) -> AppConfig:
    """analyze is one sequential producer: waiting for a batch to fill (max_delay_ms) would only add latency."""
    updates: dict[str, object] = {"inference": cfg.inference.model_copy(update={"max_delay_ms": 0.0})}
    if crop:
        updates["emotion"] = cfg.emotion.model_copy(update={"crop": crop})
    if detector_input:
        updates["detector"] = type(cfg.detector).model_validate(
            cfg.detector.model_dump() | {"input_size": detector_input})
    return cfg.model_copy(update=updates)


def run_analyze(cfg: AppConfig, paths: list[Path], every: int = 1, cropped: bool = False,
                crop: str | None = None, detector_input: tuple[int, int] | None = None) -> int:
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print(f"error: not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    cfg = _for_analyze(cfg, crop, detector_input)
    perception = Perception.from_config(cfg)
    analyzer = Analyzer(perception, cropped, every)
    try:
        perception.warm_up()
        started = time.monotonic()
        for path, label in iter_inputs(paths):
            if path.suffix.lower() in VIDEO_SUFFIXES:
                analyzer.video(path)
            else:
                analyzer.image(path, label)
        analyzer.summary.seconds = time.monotonic() - started
    finally:
        perception.close()
    sys.stdout.flush()
    print("summary: " + json.dumps(analyzer.summary.as_dict()), file=sys.stderr)
    return 2 if analyzer.summary.unreadable else 0
