"""Probe (issue 24, 2026-12-03): does faces/wild read better when each face chip is first shrunk to the resolution
the emotion network was trained at (FER2013's 48 px, the photo bundle's ~75 px) and grown back?

Why ask: every training crop is upsampled (48 or ~75 px to 150), while a visitor's face in a photo is cut sharp.
Usage, from the project root: DEGRADE=48 PYTHONPATH=. python docs/bench/issue24-2026-12-03/chip_resolution_probe.py \
    analyze ../shared/data/faces/wild > wild48.jsonl   (DEGRADE=0: unchanged; the summary is the last stderr line)
It wraps FaceCropper.face_crop for this process only; nothing in the pipeline changes.
"""

import os
import runpy
import sys

import cv2

from pipeline.vision import faces

SIDE = int(os.environ.get("DEGRADE", "0"))
_original = faces.FaceCropper.face_crop


def _shrunk_and_grown(self, image, face):  # type: ignore[no-untyped-def]
    patch = _original(self, image, face)
    if SIDE:
        height, width = patch.shape[:2]
        small = cv2.resize(patch, (SIDE, SIDE), interpolation=cv2.INTER_AREA)
        patch = cv2.resize(small, (width, height), interpolation=cv2.INTER_LINEAR)
        if patch.ndim == 2:
            patch = patch[:, :, None]
    return patch


faces.FaceCropper.face_crop = _shrunk_and_grown
sys.argv = ["run_pipeline.py", *sys.argv[1:]]
runpy.run_path("run_pipeline.py", run_name="__main__")
