"""`analyze`: images, folders or videos → one JSON line per image or frame, and a summary line on stderr.

Folders laid out as `<emotion>/<file>`, or holding a `labels.csv` (file,emotion), give an accuracy figure: the
prediction for an image is the emotion of its largest face (or of the crop itself with --cropped). Datasets name
their folders in many ways (`anger`, `Happiness`, `surprised`), so common synonyms are read case-insensitively; a
folder that still means nothing is named in a warning, because its images silently dropping out of the accuracy
would make the figure lie.

An .npz of face crops in FER2013's training-split layout (`../shared/data/train/`: FER2013's split, or the muxspace
photos) is read with --cropped, each crop with its label (photo crops are cut again around their face box with the
config's box_margin, as the pipeline cuts them); --holdout keeps only the validation hold-out that
`tools/train_emotion.py` never trains on (`pipeline.tools.fer_npz.split_bundle`: by class for FER2013, by person for
photos), so a model's hold-out figures come from the pipeline's own preprocessing, flip and model variant in one
command.

Everything the operator reads besides the JSON lines goes to stderr: a progress bar when stderr is a terminal
(a long video otherwise gives no sign of life for half a minute), warnings, and the summary. The summary is a table
(`pipeline.tools.analyze_table`) when stderr is a terminal, where a person reads it, and otherwise today's
`summary: {JSON}` line, which scripts and tests parse; --table and --json choose either. Which detector input each
image got is logged per file at DEBUG only (a folder of photos of fifty sizes gave fifty INFO lines), and once for the
run at INFO.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

import cv2
import numpy as np
from tqdm import tqdm

from pipeline.config.app import AppConfig
from pipeline.core.types import EMOTIONS, Detection, FaceResult
from pipeline.inference.classifier import EmotionClassifier
from pipeline.inference.perception import (
    RESULT_TIMEOUT_S,
    Perception,
    load_batched_model,
)
from pipeline.modelprep.manifest import load_manifest
from pipeline.outputs.events import face_json
from pipeline.tools.analyze_table import format_summary_table, shown_sizes
from pipeline.tools.fer_npz import (
    HOLDOUT_FRACTION,
    HOLDOUT_SEED,
    BundleError,
    CropBundle,
    holdout,
    load_bundle,
)

log = logging.getLogger(__name__)

DetectorInput = tuple[int, int] | Literal["auto"]  # --detector-input: WxH or auto
Bundles = list[tuple[Path, CropBundle]]  # the .npz inputs, loaded
SummaryForm = Literal["auto", "json", "table"]  # --json, --table, or auto: a table when stderr is a terminal

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}
VIDEO_SUFFIXES = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg"}
EXIT_BAD_INPUT = 2  # SPEC.md: `analyze` exits 2 on unreadable input
BUNDLE_SUFFIX = ".npz"  # face crops with labels (FER2013's training split as ../shared/data ships it)
NO_FACE = "no_face"  # the confusion matrix's column for a labelled image in which no face was found

# Folder and labels.csv names that datasets use for the seven emotions (compared lower-case). `calm` and
# `contempt` are deliberately absent: neither is one of the seven, and guessing would bias the accuracy.
LABEL_SYNONYMS: dict[str, str] = {e: e for e in EMOTIONS} | {
    "anger": "angry", "disgusted": "disgust", "fearful": "fear", "afraid": "fear", "scared": "fear",
    "happiness": "happy", "sadness": "sad", "surprised": "surprise",
}


def canonical_label(name: str) -> str | None:
    """The canonical emotion a folder or labels.csv entry names, or None when it names none of the seven."""
    return LABEL_SYNONYMS.get(name.strip().lower())


@dataclass
class Summary:
    images: int = 0
    frames: int = 0
    faces: int = 0
    unreadable: list[str] = field(default_factory=list)
    too_small: list[str] = field(default_factory=list)
    unlabelled_folders: Counter[str] = field(default_factory=Counter)
    detector_inputs: Counter[str] = field(default_factory=Counter)  # "WxH" → images and frames detected at it
    emotions: Counter[str] = field(default_factory=Counter)
    faces_per_image: Counter[int] = field(default_factory=Counter)
    labelled: int = 0
    correct: int = 0
    confusion: Counter[tuple[str, str]] = field(default_factory=Counter)  # (label, answer or NO_FACE) → images
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
            "detector_input": ", ".join(self.detector_inputs) or None,  # first used first; None with --cropped
        }
        if self.labelled:
            out["labelled"] = self.labelled
            out["accuracy"] = round(self.correct / self.labelled, 4)
            out.update(self._per_class())
        if self.unlabelled_folders:
            out["unlabelled_folders"] = dict(sorted(self.unlabelled_folders.items()))
        if self.too_small:
            out["smaller_than_min_face_px"] = len(self.too_small)
        if self.unreadable:
            out["unreadable"] = self.unreadable
        return out

    def _per_class(self) -> dict[str, object]:
        """Recall per labelled emotion and the confusion matrix (rows: label; columns: the answer, or NO_FACE when
        the detector found none), so a model's weak classes show in one command."""
        labels = [e for e in EMOTIONS if any(label == e for label, _ in self.confusion)]
        columns = [*EMOTIONS, NO_FACE]
        rows = {label: {answer: self.confusion[(label, answer)] for answer in columns} for label in labels}
        recall = {label: round(row[label] / max(1, sum(row.values())), 4) for label, row in rows.items()}
        return {"recall": recall, "confusion": rows}


@dataclass
class Inputs:
    """What the command line named, walked: each file with its label, and the folders whose name is no emotion."""

    items: list[tuple[Path, str | None]] = field(default_factory=list)
    bundles: list[Path] = field(default_factory=list)  # .npz files of labelled face crops
    unlabelled_folders: Counter[str] = field(default_factory=Counter)
    unknown_labels: Counter[str] = field(default_factory=Counter)


def _labels_for(folder: Path, unknown: Counter[str]) -> dict[str, str]:
    table = folder / "labels.csv"
    if not table.is_file():
        return {}
    labels: dict[str, str] = {}
    with table.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            emotion = canonical_label(row.get("emotion") or "")
            if emotion is not None:
                labels[row["file"]] = emotion
            elif row.get("emotion"):
                unknown[f"{table}: {row['emotion']}"] += 1
    return labels


def _label_of(path: Path, labels: dict[str, str]) -> str | None:
    if path.name in labels:
        return labels[path.name]
    return canonical_label(path.parent.name)


def collect_inputs(paths: list[Path]) -> Inputs:
    """Every image or video named, folders walked recursively in sorted order, with its label if known."""
    found = Inputs()
    for path in paths:
        if path.suffix.lower() == BUNDLE_SUFFIX:
            found.bundles.append(path)
            continue
        if not path.is_dir():
            found.items.append((path, _label_of(path, _labels_for(path.parent, Counter()))))
            continue
        tables: dict[Path, dict[str, str]] = {}
        for child in sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES | VIDEO_SUFFIXES):
            table = tables.setdefault(child.parent, _labels_for(child.parent, found.unknown_labels))
            label = _label_of(child, table)
            found.items.append((child, label))
            if label is None and child.parent != path and child.suffix.lower() in IMAGE_SUFFIXES:
                found.unlabelled_folders[str(child.parent.relative_to(path))] += 1
    return found


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


class CroppedModels:
    """`--cropped`: each image is already a face, so only the emotion model is loaded (the detector would cost
    start-up time and memory for nothing)."""

    def __init__(self, cfg: AppConfig) -> None:
        manifest = load_manifest(cfg.emotion.model)
        model = load_batched_model(manifest, cfg.inference)
        self.classifier = EmotionClassifier(model, manifest, cfg.emotion.crop, cfg.emotion.box_margin,
                                            cfg.emotion.flip)

    def warm_up(self) -> None:
        w, h = self.classifier.size
        self.classifier.model.warm_up((h, w, self.classifier.channels), np.dtype(np.uint8))
        self.classifier.classify([self.classifier.crop_from_still(np.zeros((h, w, 3), np.uint8))], RESULT_TIMEOUT_S)

    def close(self) -> None:
        self.classifier.model.close()


class Analyzer:
    """Analyses one image or video at a time, writes its JSON lines and keeps the summary's counts."""

    def __init__(self, models: Perception | CroppedModels, every: int, min_face_px: int = 0) -> None:
        self.models = models
        self.cropped = not isinstance(models, Perception)
        self.every = max(1, every)
        self.min_face_px = min_face_px
        self.summary = Summary()
        self.progress: Any = None  # a tqdm bar while one is shown
        self._frame_sizes: set[tuple[int, int]] = set()  # frame sizes whose detector input was logged
        self.write_line: Callable[[str], object] = sys.stdout.write

    def image(self, path: Path, label: str | None) -> None:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            self.summary.unreadable.append(str(path))
            log.error("%s: unreadable image (not an image, or corrupt)", path)
            self._advance()
            return
        self.summary.images += 1
        if not self.cropped and min(image.shape[:2]) < self.min_face_px:
            self.summary.too_small.append(str(path))  # the detector drops every face narrower than this
        self._note_input(path, image, new_source=False)
        faces = self._faces(image)
        self._emit({"source": str(path), "frame": 0}, faces, label)

    def crops(self, path: Path, bundle: CropBundle) -> None:
        """Each crop of an .npz (--cropped), as `FILE#POSITION`, with its label."""
        for image, label, position in zip(bundle.images, bundle.labels, bundle.positions):
            self.summary.images += 1
            self._emit({"source": f"{path}#{position}", "frame": 0}, self._faces(image, bundle.box_margin),
                       canonical_label(bundle.label_names[label]))

    def video(self, path: Path) -> None:
        frames = _prefetched_frames(path, self.every)
        read_any = False
        for index, frame in frames:
            self._note_input(path, frame, new_source=not read_any)
            read_any = True
            self.summary.frames += 1
            self._emit({"source": str(path), "frame": index}, self._faces(frame), None)
        if not read_any:
            self.summary.unreadable.append(str(path))
            log.error("%s: unreadable video (unsupported format, corrupt or empty)", path)

    def _note_input(self, path: Path, image: np.ndarray, new_source: bool) -> None:
        """Count the detector input this image or frame gets, and say it per source at DEBUG: for each video, and for
        images once per image size. At INFO a folder of photos of many sizes gave a line per photo before the summary;
        `_log_detector_inputs` says it once for the run instead."""
        if not isinstance(self.models, Perception):
            return
        height, width = image.shape[:2]
        size = self.models.detector.input_for((width, height))
        self.summary.detector_inputs[f"{size[0]}x{size[1]}"] += 1
        if new_source or (width, height) not in self._frame_sizes:
            self._frame_sizes.add((width, height))
            log.debug("%s: %dx%d frames, detector input %dx%d", path, width, height, *size)

    def _faces(self, image: np.ndarray, stored_margin: float | None = None) -> list[FaceResult]:
        if not isinstance(self.models, Perception):  # --cropped: the image is the face
            classifier = self.models.classifier
            t0 = time.monotonic()
            crop_scores = classifier.classify([classifier.crop_from_still(image, stored_margin)])[0]
            self.summary.stage_ms["emotion"] += (time.monotonic() - t0) * 1e3  # type: ignore[assignment]
            height, width = image.shape[:2]
            box = Detection((0.0, 0.0, float(width), float(height)), 1.0, np.zeros((5, 2), np.float32))
            return [FaceResult(box, crop_scores)]
        faces, scores, timings = self.models.analyze(image)
        self.summary.stage_ms.update(timings)
        return [FaceResult(face, score) for face, score in zip(faces, scores)]

    def _emit(self, head: dict[str, object], faces: list[FaceResult], label: str | None) -> None:
        self.summary.faces += len(faces)
        self.summary.faces_per_image[len(faces)] += 1
        for face in faces:
            self.summary.emotions[face.scores.emotion] += 1
        if label is not None:
            answer = max(faces, key=lambda f: f.detection.area).scores.emotion if faces else NO_FACE
            self.summary.labelled += 1
            self.summary.correct += answer == label
            self.summary.confusion[(label, answer)] += 1
        record = dict(head, faces=[face_json(f, with_track=False) for f in faces])
        if label is not None:
            record["label"] = label
        self.write_line(json.dumps(record, separators=(",", ":")) + "\n")
        self._advance()

    def _advance(self) -> None:
        if self.progress is not None:
            self.progress.update(1)


def _for_analyze(cfg: AppConfig, crop: str | None, detector_input: DetectorInput | None) -> AppConfig:
    """analyze is one sequential producer: waiting for a batch to fill (max_delay_ms) would only add latency."""
    updates: dict[str, object] = {"inference": cfg.inference.model_copy(update={"max_delay_ms": 0.0})}
    if crop:
        updates["emotion"] = cfg.emotion.model_copy(update={"crop": crop})
    if detector_input:
        updates["detector"] = type(cfg.detector).model_validate(
            cfg.detector.model_dump() | {"input_size": detector_input})
    return cfg.model_copy(update=updates)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _expected_items(items: list[tuple[Path, str | None]], every: int) -> int | None:
    """Images plus the video frames that will be analysed, for the progress bar (None: a video hides its length)."""
    total = 0
    for path, _ in items:
        if path.suffix.lower() not in VIDEO_SUFFIXES:
            total += 1
            continue
        cap = cv2.VideoCapture(str(path))
        count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) if cap.isOpened() else 0
        cap.release()
        if count <= 0:
            return None
        total += -(-count // every)
    return total


class _AboveTheBar:
    """A stream for the log handlers while the bar is shown: each record is printed above the bar, not through it."""

    def write(self, text: str) -> int:
        tqdm.write(text, file=sys.stderr, end="")
        return len(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _progress_bar(items: list[tuple[Path, str | None]], every: int, crops: int) -> tqdm:  # type: ignore[type-arg]
    """The bar, sized to the terminal; one that reports no size (0x0, e.g. a fresh pseudo-terminal) gets 80x24,
    as tqdm would otherwise draw nothing at all."""
    try:
        width = os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError):
        width = 0
    sized = {"dynamic_ncols": True} if width > 0 else {"ncols": 80, "nrows": 24}
    unit = "frame" if any(p.suffix.lower() in VIDEO_SUFFIXES for p, _ in items) else "image"
    expected = _expected_items(items, every)
    total = None if expected is None else expected + crops
    return tqdm(total=total, file=sys.stderr, desc="analyze", unit=unit, **sized)


@contextmanager
def _progress(analyzer: Analyzer, items: list[tuple[Path, str | None]], crops: int = 0) -> Iterator[None]:
    """A tqdm bar on stderr while stderr is a terminal; logs and (on a terminal) the JSON lines print above it."""
    if not _is_terminal(sys.stderr):
        yield
        return
    bar = _progress_bar(items, analyzer.every, crops)
    handlers = [h for h in logging.getLogger().handlers
                if isinstance(h, logging.StreamHandler) and h.stream is sys.stderr]
    for handler in handlers:
        handler.setStream(_AboveTheBar())  # type: ignore[arg-type]
    analyzer.progress = bar
    if _is_terminal(sys.stdout):
        analyzer.write_line = lambda line: tqdm.write(line, file=sys.stdout, end="")
    try:
        yield
    finally:
        bar.close()
        analyzer.progress, analyzer.write_line = None, sys.stdout.write
        for handler in handlers:
            handler.setStream(sys.stderr)


def _warn_about_inputs(inputs: Inputs) -> None:
    """Labels that would silently drop out of the accuracy: say which, and how to name them."""
    if inputs.unlabelled_folders:
        folders = ", ".join(f"{name} ({count})" for name, count in sorted(inputs.unlabelled_folders.items()))
        known = ", ".join(sorted(set(LABEL_SYNONYMS) - set(EMOTIONS)))
        log.warning("folders not named after an emotion, their images count as unlabelled (not in the accuracy): "
                    "%s. Label folders are %s (any case; also %s)", folders, ", ".join(EMOTIONS), known)
    for where, count in sorted(inputs.unknown_labels.items()):
        log.warning("%s: label is none of the seven emotions, %d file(s) count as unlabelled", where, count)


def _warn_about_results(summary: Summary, min_face_px: int) -> None:
    if summary.too_small:
        shown = ", ".join(summary.too_small[:5]) + (", ..." if len(summary.too_small) > 5 else "")
        log.warning("%d image(s) smaller than detector.min_face_px (%d px) on a side: no face can be found in them "
                    "(already face crops? use --cropped): %s", len(summary.too_small), min_face_px, shown)


def _log_detector_inputs(summary: Summary) -> None:
    """The detector inputs of the run in one INFO line (each file's is at DEBUG)."""
    if not summary.detector_inputs:
        return  # --cropped: no detector
    sizes = list(summary.detector_inputs)
    analysed = sum(summary.detector_inputs.values())
    log.info("detector input for %d image(s) and frame(s): %s%s", analysed, shown_sizes(sizes),
             " (--log-level debug names each file's)" if len(sizes) > 1 else "")


def print_summary(summary: Summary, form: SummaryForm = "auto") -> None:
    """The summary on stderr: a table where a person reads it (stderr a terminal, or --table), else the one
    `summary: {JSON}` line scripts parse (unchanged since before the table, so they keep working)."""
    as_table = form == "table" or (form == "auto" and _is_terminal(sys.stderr))
    if as_table:
        print(format_summary_table(summary.as_dict()), file=sys.stderr)
    else:
        print("summary: " + json.dumps(summary.as_dict()), file=sys.stderr)


def _load_models(cfg: AppConfig, cropped: bool, detector_input_given: bool) -> Perception | CroppedModels:
    """The models the run needs, saying which detector input is used (`bench analyze` has its own default)."""
    if cropped:
        log.info("--cropped: each image is one face, no detector loaded")
        return CroppedModels(cfg)
    log.info("detector input %s (%s)", cfg.detector.describe_input(), "--detector-input" if detector_input_given
             else "detector.input_size of the config; --detector-input WxH or auto to change")
    return Perception.from_config(cfg)


class _BadInput(Exception):
    """An input the command cannot analyse: its message is printed as `error: ...` and the command exits 2."""


def _bundles(inputs: Inputs, cropped: bool, only_holdout: bool) -> Bundles:
    """The .npz inputs, loaded (and cut to the training hold-out with --holdout)."""
    if inputs.bundles and not cropped:
        raise _BadInput(f"{inputs.bundles[0]}: an .npz holds face crops: analyze it with --cropped")
    if only_holdout and not inputs.bundles:
        raise _BadInput("--holdout selects crops of an .npz (a training bundle); no .npz was given")
    loaded = []
    for path in inputs.bundles:
        try:
            bundle = load_bundle(path)
        except BundleError as exc:
            raise _BadInput(str(exc)) from exc
        if only_holdout:
            whole, bundle = len(bundle), holdout(bundle)
            log.info("%s: the training hold-out, %d of %d crops (%.0f %% of %s, split seed %d, as "
                     "tools/train_emotion.py holds out)", path, len(bundle), whole, 100 * HOLDOUT_FRACTION,
                     "each class" if bundle.sources is None else "the people, every photo of them", HOLDOUT_SEED)
        loaded.append((path, bundle))
    return loaded


def _checked_inputs(paths: list[Path], cropped: bool, only_holdout: bool) -> tuple[Inputs, Bundles]:
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise _BadInput(f"not found: {', '.join(missing)}")
    inputs = collect_inputs(paths)
    if not inputs.items and not inputs.bundles:
        raise _BadInput(f"no image or video in {', '.join(map(str, paths))} (looked for "
                        f"{', '.join(sorted(IMAGE_SUFFIXES | VIDEO_SUFFIXES | {BUNDLE_SUFFIX}))})")
    return inputs, _bundles(inputs, cropped, only_holdout)


def _analyze_all(analyzer: Analyzer, inputs: Inputs, bundles: Bundles) -> None:
    with _progress(analyzer, inputs.items, sum(len(bundle) for _, bundle in bundles)):
        for path, label in inputs.items:
            if path.suffix.lower() in VIDEO_SUFFIXES:
                analyzer.video(path)
            else:
                analyzer.image(path, label)
        for path, bundle in bundles:
            analyzer.crops(path, bundle)


def run_analyze(cfg: AppConfig, paths: list[Path], every: int = 1, cropped: bool = False,
                crop: str | None = None, detector_input: DetectorInput | None = None,
                only_holdout: bool = False, summary_form: SummaryForm = "auto") -> int:
    """The `analyze` command: 0 when every input was analysed, 2 (SPEC: bad input) when one is missing or
    unreadable, or when nothing at all could be read (a summary of zeros would look like a result)."""
    try:
        inputs, bundles = _checked_inputs(paths, cropped, only_holdout)
    except _BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    _warn_about_inputs(inputs)
    cfg = _for_analyze(cfg, crop, detector_input)
    models = _load_models(cfg, cropped, detector_input is not None)
    analyzer = Analyzer(models, every, cfg.detector.min_face_px)
    summary = analyzer.summary
    summary.unlabelled_folders = inputs.unlabelled_folders
    try:
        models.warm_up()
        started = time.monotonic()
        _analyze_all(analyzer, inputs, bundles)
        summary.seconds = time.monotonic() - started
    finally:
        models.close()
    sys.stdout.flush()
    if summary.images + summary.frames == 0:
        print(f"error: nothing could be read: all {len(inputs.items)} input(s) are unreadable", file=sys.stderr)
        return EXIT_BAD_INPUT
    _warn_about_results(summary, cfg.detector.min_face_px)
    _log_detector_inputs(summary)
    print_summary(summary, summary_form)
    return EXIT_BAD_INPUT if summary.unreadable else 0
