"""The GPU path's frame graphs (pipeline/modelprep/frame_graphs.py) against the host path they replace, run on the CPU
through ONNX Runtime with the real prepared models on real frames.

Measured with the pinned opencv-python 5.0.0.93 and onnxruntime 1.32.0 (2026-12-01, dev-2c):
- letterbox: bit-exact (0 differing values) against letterbox() on group_1080p.mp4 (1920x1080 → 640x352: one 2x2
  halving + bilinear; → 320x192: two halvings + bilinear) and woman2.mp4 (596x336 → 640x352: a bilinear upscale
  then; padding only since fit_size caps the scale at 1), in both channel orders. Plain ONNX Resize differed by one
  grey level in ~10% of pixels, which moved 1080p boxes by up to 3 px: hence the graph's cv2-exact bilinear.
- detector: the same faces per frame on 20 + 20 video frames and 8 photos, fp32 and fp16; fp32 boxes within
  6e-5 px, landmarks equal; fp16 within 0.04 px (the host decodes fp16 outputs partly in fp16 arithmetic).
- crops: 1 value in ~270,000 differs by one grey level from cv2.warpAffine (OpenCV 5 samples in float; ours too, in
  a different operation order), box and aligned crops, gray/rgb/bgr, faces sticking out of the frame included.
- classifier: probabilities equal (max difference 0.0) for fp32 and fp16, same top emotion.
The asserted bounds are tight enough that ONNX Resize's letterbox, a wrong pixel-centre convention or an unclamped
border would fail them.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from pipeline.core.types import Detection
from pipeline.inference.frame_faces import kept_faces
from pipeline.modelprep.frame_graphs import (
    CROP_OUTPUT,
    DETECTOR_OUTPUTS,
    FACE_BOX,
    FACE_LANDMARKS,
    FACE_SCORE,
    FRAME_INDEX_INPUT,
    FRAME_INPUT,
    IOU_THRESHOLD,
    LETTERBOX_OUTPUT,
    MATRIX_INPUT,
    SCORE_THRESHOLD,
    FrameFormat,
    crop_classify_graph,
    crop_graph,
    detector_frame_graph,
    detector_graph_parts,
    letterbox_graph,
)
from pipeline.modelprep.graph_edit import GraphEditError
from pipeline.vision.align import align_matrix, box_crop_matrix, inverse_affine
from pipeline.vision.faces import FaceCropper
from pipeline.vision.retinaface import decode, filter_faces, letterbox
from tests.conftest import data_path

DETECTOR, CLASSIFIER = "retinaface_mnet025", "mini_xception_fer2013"
CROP_SIZE = (64, 64)


@lru_cache(maxsize=4)
def _frames(name: str, count: int, step: int) -> np.ndarray:
    """`count` BGR frames of a test video, every `step`-th, as one batch [count, H, W, 3]."""
    cap = cv2.VideoCapture(str(data_path("video", name)))
    frames = []
    for index in range(count * step):
        ok, frame = cap.read()
        if not ok:
            break
        if index % step == 0:
            frames.append(frame)
    cap.release()
    return np.stack(frames)


def _session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the prepared detector carries unused constants ORT would warn about
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def models(prepared_models: None) -> dict[str, Path]:
    """Both precisions of both models (prepare-models' own path; fp32 is already there)."""
    from pipeline.modelprep.manifest import load_manifest
    from pipeline.modelprep.prepare import ModelError, prepare_model

    try:
        return {f"{name}.{precision}": path for name in (DETECTOR, CLASSIFIER)
                for precision, path in zip(("fp32", "fp16"), prepare_model(load_manifest(name), ["fp32", "fp16"]))}
    except ModelError as exc:
        pytest.skip(f"fp16 models cannot be prepared here: {exc}")


@pytest.fixture(scope="module")
def thresholds(app_config) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The default config's detector thresholds (score 0.8, NMS IoU 0.4)."""
    return app_config.detector.score_threshold, app_config.detector.nms_threshold


# --- letterbox -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("video", "size"), [("group_1080p.mp4", (640, 352)), ("group_1080p.mp4", (320, 192)),
                                             ("woman2.mp4", (640, 352))])
@pytest.mark.parametrize("order", ["bgr", "rgb"])
@pytest.mark.parametrize("conv", [False, True], ids=["pool", "conv"])
def test_letterbox_graph_reproduces_letterbox(video: str, size: tuple[int, int], order: str, conv: bool) -> None:
    frames = _frames(video, 3, 17)
    height, width = frames.shape[1:3]
    fed = frames if order == "bgr" else np.ascontiguousarray(frames[..., ::-1])
    graph = letterbox_graph(FrameFormat(width, height, order), size, conv_halving=conv)  # type: ignore[arg-type]
    ours = _session(graph).run([LETTERBOX_OUTPUT], {FRAME_INPUT: fed})[0]
    host = np.stack([letterbox(frame, size)[0] for frame in frames])
    assert ours.shape == host.shape == (len(frames), size[1], size[0], 3) and ours.dtype == np.uint8
    diff = np.abs(ours.astype(np.int16) - host)
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (diff.max(), (diff > 0).mean())


@pytest.mark.parametrize("crop", [(0, 0), (1, 3)], ids=["even", "odd"])
def test_conv_halving_is_averagepools_arithmetic(crop: tuple[int, int]) -> None:
    """The first halving as a strided Conv straight from NHWC (no transpose) gives AveragePool's bytes, also for an
    odd frame size, where both drop the last row/column before halving."""
    frames = _frames("group_1080p.mp4", 2, 23)
    frames = np.ascontiguousarray(frames[:, : frames.shape[1] - crop[1], : frames.shape[2] - crop[0]])
    fmt = FrameFormat(frames.shape[2], frames.shape[1], "rgb")
    outputs = [_session(letterbox_graph(fmt, (320, 192), conv_halving=conv)).run(
        [LETTERBOX_OUTPUT], {FRAME_INPUT: frames})[0] for conv in (False, True)]
    assert outputs[0].shape == (2, 192, 320, 3)
    assert np.array_equal(outputs[0], outputs[1]), np.abs(outputs[0].astype(int) - outputs[1]).max()


def test_the_gpus_letterbox_float16_and_conv_is_exact_too() -> None:
    """What the lanes run on a GPU (float16 halving by the strided Conv) gives letterbox()'s bytes: checked here on
    the CPU provider, which runs a float16 Conv (not a float16 AveragePool, hence one halving: 1080p to 640x352)."""
    frames = _frames("group_1080p.mp4", 2, 29)
    fmt = FrameFormat(frames.shape[2], frames.shape[1], "bgr")
    graph = letterbox_graph(fmt, (640, 352), halve_in_fp16=True, conv_halving=True)
    ours = _session(graph).run([LETTERBOX_OUTPUT], {FRAME_INPUT: frames})[0]
    assert np.array_equal(ours, np.stack([letterbox(frame, (640, 352))[0] for frame in frames]))


# --- detector --------------------------------------------------------------------------------------------------

@lru_cache(maxsize=8)
def _frame_detector(path: Path, width: int, height: int, size: tuple[int, int]) -> ort.InferenceSession:
    return _session(detector_frame_graph(onnx.load(str(path)), FrameFormat(width, height, "bgr"), size, 16))


def _graph_faces(path: Path, frames: np.ndarray, size: tuple[int, int], score: float,
                 iou: float) -> list[np.ndarray]:
    session = _frame_detector(path, frames.shape[2], frames.shape[1], size)
    feeds = {FRAME_INPUT: frames, SCORE_THRESHOLD: np.array([score], np.float32),
             IOU_THRESHOLD: np.array([iou], np.float32)}
    return session.run([FACE_SCORE, FACE_BOX, FACE_LANDMARKS], feeds)


def _host_faces(path: Path, frames: np.ndarray, size: tuple[int, int], score: float,
                iou: float) -> list[list[Detection]]:
    """The host path: letterbox() + the same prepared detector + decode(), one frame at a time."""
    session = _session(path)
    names = [o.name for o in session.get_outputs()]
    faces = []
    for frame in frames:
        canvas, fit = letterbox(frame, size)
        outputs = {name: value[0] for name, value in zip(names, session.run(None, {"image": canvas[None]}))}
        faces.append(sorted(decode(outputs, size, fit, score, iou), key=lambda f: -f.score))
    return faces


def _assert_same_faces(graph: list[np.ndarray], host: list[list[Detection]], frame_size: tuple[int, int]) -> int:
    """Same faces, best first; a frame with more faces than the graph's F rows keeps the F best. Returns the
    host's face count."""
    scores, boxes, points = graph
    width, height = frame_size
    for index, found in enumerate(host):
        faces = found[: scores.shape[1]]
        kept = scores[index] > -1
        assert kept.sum() == len(faces), f"frame {index}: graph {kept.sum()} faces, host {len(faces)}"
        assert kept[: len(faces)].all() and (scores[index][~kept] == -1).all()
        for rank, face in enumerate(faces):
            box = np.clip(boxes[index, rank], 0, [width, height, width, height])
            assert abs(scores[index, rank] - face.score) < 1e-5
            assert np.abs(box - face.box).max() <= 1.0, (box, face.box)
            assert np.abs(points[index, rank] - face.landmarks).max() <= 1.0
    return sum(len(faces) for faces in host)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize(("video", "step"), [("group_1080p.mp4", 5), ("woman2.mp4", 20)])
def test_detector_graph_finds_the_faces_the_host_finds(models: dict[str, Path], thresholds: tuple[float, float],
                                                       precision: str, video: str, step: int) -> None:
    frames = _frames(video, 20, step)
    assert len(frames) == 20
    path, size = models[f"{DETECTOR}.{precision}"], (640, 352)
    graph = _graph_faces(path, frames, size, *thresholds)
    assert graph[0].shape == (20, 16) and graph[1].shape == (20, 16, 4) and graph[2].shape == (20, 16, 5, 2)
    found = _assert_same_faces(graph, _host_faces(path, frames, size, *thresholds), frames.shape[2:0:-1])
    assert found >= (80 if video.startswith("group") else 20)


def test_the_detector_graph_in_two_parts_finds_the_same_faces(models: dict[str, Path],
                                                              thresholds: tuple[float, float]) -> None:
    """The body (letterbox + detector, what a GPU captures as a CUDA graph) and the tail (decode + NMS) run one after
    the other give the whole graph's faces exactly, on crowd frames; the body's outputs are the prepared detector's
    top-K candidates, K as the parts say."""
    frames = _frames("group_1080p.mp4", 6, 11)
    fmt = FrameFormat(frames.shape[2], frames.shape[1], "bgr")
    detector = onnx.load(str(models[f"{DETECTOR}.fp32"]))
    parts = detector_graph_parts(detector, fmt, (640, 352), 16)
    middle = _session(parts.body).run(list(DETECTOR_OUTPUTS), {FRAME_INPUT: frames})
    declared = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim[1:]] for o in parts.body.graph.output}
    for name, value in zip(DETECTOR_OUTPUTS, middle):  # the sizes a captured body's buffers are allocated from
        assert list(value.shape) == [len(frames), *declared[name]] and declared[name][0] == parts.candidates
    feeds = {**dict(zip(DETECTOR_OUTPUTS, middle)), SCORE_THRESHOLD: np.array([thresholds[0]], np.float32),
             IOU_THRESHOLD: np.array([thresholds[1]], np.float32)}
    split = _session(parts.tail).run([FACE_SCORE, FACE_BOX, FACE_LANDMARKS], feeds)
    whole = _graph_faces(models[f"{DETECTOR}.fp32"], frames, (640, 352), *thresholds)
    assert (whole[0] > -1).sum() >= 20  # crowd frames: the comparison covers many faces
    for ours, reference in zip(split, whole):
        assert np.array_equal(ours, reference)


@pytest.mark.parametrize(("min_face_px", "max_faces"), [(0, 16), (40, 16), (0, 3), (60, 2)])
def test_kept_faces_is_filter_faces_for_a_whole_batch(models: dict[str, Path], thresholds: tuple[float, float],
                                                       min_face_px: int, max_faces: int) -> None:
    """The lane's vectorised selection gives, frame by frame, the faces filter_faces keeps from the same rows
    (clipped as the OpenCV path clips, small faces dropped, the largest first): same boxes, scores, landmarks, order."""
    frames = _frames("group_1080p.mp4", 12, 7)
    score, box, points = _graph_faces(models[f"{DETECTOR}.fp32"], frames, (640, 352), *thresholds)
    width, height = frames.shape[2], frames.shape[1]
    kept = kept_faces(score, box, points, (width, height), min_face_px, max_faces)
    compared = 0
    for index in range(len(frames)):
        rows = np.flatnonzero(score[index] >= 0)
        clipped = np.clip(box[index][rows].astype(np.float64), 0.0, [width, height, width, height])
        found = [Detection(box=tuple(float(v) for v in b), score=float(s), landmarks=p.astype(np.float32))
                 for b, s, p in zip(clipped, score[index][rows], points[index][rows])]
        expected = filter_faces(found, min_face_px, max_faces)
        mine = kept.rows(index)
        assert len(kept.boxes[mine]) == len(expected), index
        for face, ours, our_score, our_points in zip(expected, kept.boxes[mine], kept.scores[mine],
                                                     kept.landmarks[mine]):
            assert tuple(ours) == face.box and our_score == face.score
            assert np.array_equal(our_points, face.landmarks)
        compared += len(expected)
    assert (kept.frame == np.repeat(np.arange(len(frames)), np.diff(kept.offsets))).all()
    assert compared >= (len(frames) * max_faces if max_faces < 4 else 40)  # the test saw faces, and the cap bit


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_detector_graph_on_a_batch_of_photos(models: dict[str, Path], thresholds: tuple[float, float],
                                             app_config, precision: str) -> None:  # type: ignore[no-untyped-def]
    """Eight 350x350 photos at the default config's input size for them (auto: 352x352, scale 1, padded)."""
    paths = sorted(data_path("faces", "wild").glob("*.jpg"))[:20]
    photos = [image for p in paths if (image := cv2.imread(str(p))) is not None and image.shape == (350, 350, 3)][:8]
    batch, path, size = np.stack(photos), models[f"{DETECTOR}.{precision}"], app_config.detector.input_for((350, 350))
    graph = _graph_faces(path, batch, size, *thresholds)
    assert _assert_same_faces(graph, _host_faces(path, batch, size, *thresholds), (350, 350)) >= 7


def test_thresholds_are_runtime_inputs(models: dict[str, Path]) -> None:
    """One graph, other thresholds: a higher score threshold keeps fewer faces, a looser IoU more; the host agrees."""
    frames, path, size = _frames("group_1080p.mp4", 20, 5)[:6], models[f"{DETECTOR}.fp32"], (640, 352)
    counts = {}
    for score, iou in [(0.8, 0.4), (0.97, 0.4), (0.5, 0.9)]:
        graph = _graph_faces(path, frames, size, score, iou)
        counts[score, iou] = _assert_same_faces(graph, _host_faces(path, frames, size, score, iou), (1920, 1080))
    assert counts[0.97, 0.4] < counts[0.8, 0.4] < counts[0.5, 0.9], counts


def test_frames_without_faces_score_minus_one(models: dict[str, Path], thresholds: tuple[float, float]) -> None:
    real = _frames("woman2.mp4", 20, 20)[:1]
    blank = np.full_like(real, 128)
    path, size = models[f"{DETECTOR}.fp32"], (640, 352)
    scores, _, _ = _graph_faces(path, np.concatenate([blank, real, blank]), size, *thresholds)
    assert (scores[[0, 2]] == -1).all() and (scores[1] > -1).sum() == 1
    alone, _, _ = _graph_faces(path, blank[:1], size, *thresholds)  # nothing kept anywhere: NMS returns no rows
    assert alone.shape == (1, 16) and (alone == -1).all()


# --- crops and classifier --------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _crop_faces(path: Path) -> tuple[np.ndarray, list[tuple[int, Detection]]]:
    """Three group_1080p frames and (frame, face) pairs: the host's detections plus two faces sticking out of the
    frame (bottom-left corner, top-right corner) that exercise the replicated border."""
    frames = _frames("group_1080p.mp4", 20, 5)[:3]
    faces = [(index, face) for index, found in enumerate(_host_faces(path, frames, (640, 352), 0.8, 0.4))
             for face in found]
    corner = np.array([[-10, 950], [40, 955], [10, 1000], [-5, 1050], [35, 1052]], np.float32)
    faces.append((0, Detection(box=(-40.0, 900.0, 80.0, 1130.0), score=1.0, landmarks=corner)))
    top_right = np.array([[1870, 0], [1930, 5], [1900, 40], [1875, 70], [1925, 72]], np.float32)
    faces.append((2, Detection(box=(1850.0, -30.0, 1990.0, 100.0), score=1.0, landmarks=top_right)))
    return frames, faces


def _crop_feeds(frames: np.ndarray, faces: list[tuple[int, Detection]], cropper: FaceCropper,
                order: str) -> dict[str, np.ndarray]:
    matrices = np.stack([align_matrix(f.landmarks, cropper.size) if cropper.crop == "align"
                         else box_crop_matrix(f.box, cropper.size, cropper.box_margin) for _, f in faces])
    fed = frames if order == "bgr" else np.ascontiguousarray(frames[..., ::-1])
    return {FRAME_INPUT: fed, MATRIX_INPUT: inverse_affine(matrices).astype(np.float32),
            FRAME_INDEX_INPUT: np.array([index for index, _ in faces], np.int64)}


def test_inverse_affine_is_warpaffines_inverse() -> None:
    matrices = np.stack([box_crop_matrix((10.0, 20.0, 110.0, 140.0), CROP_SIZE, 0.1),
                         align_matrix(np.array([[30, 40], [70, 41], [50, 60], [35, 80], [66, 81]], float), CROP_SIZE)])
    inverse = inverse_affine(matrices)
    assert inverse.shape == (2, 2, 3)
    for matrix, inv in zip(matrices, inverse):
        np.testing.assert_allclose(inv, cv2.invertAffineTransform(matrix), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(inverse_affine(matrices[0]), inverse[0])


@pytest.mark.parametrize(("crop", "colour", "order"), [("box", "gray", "bgr"), ("align", "gray", "bgr"),
                                                       ("box", "gray", "rgb"), ("align", "rgb", "rgb"),
                                                       ("box", "bgr", "rgb")])
def test_crop_graph_reproduces_face_cropper(models: dict[str, Path], crop: str, colour: str, order: str) -> None:
    frames, faces = _crop_faces(models[f"{DETECTOR}.fp32"])
    cropper = FaceCropper(CROP_SIZE, colour, crop, 0.1)  # type: ignore[arg-type]
    graph = crop_graph(FrameFormat(1920, 1080, order), CROP_SIZE, colour)  # type: ignore[arg-type]
    ours = _session(graph).run([CROP_OUTPUT], _crop_feeds(frames, faces, cropper, order))[0]
    host = np.stack([cropper.face_crop(frames[index], face) for index, face in faces])
    assert ours.shape == host.shape == (len(faces), 64, 64, cropper.channels) and len(faces) >= 10
    diff = np.abs(ours.astype(np.int16) - host)
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (diff.max(), (diff > 0).mean())
    assert np.abs(ours[-2:].astype(np.int16) - host[-2:]).max() <= 1  # the faces outside the frame


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_crop_classify_graph_matches_the_host_classifier(  # type: ignore[no-untyped-def]
        models: dict[str, Path], app_config, precision: str) -> None:
    frames, faces = _crop_faces(models[f"{DETECTOR}.fp32"])
    path = models[f"{CLASSIFIER}.{precision}"]
    cropper = FaceCropper(CROP_SIZE, "gray", app_config.emotion.crop, app_config.emotion.box_margin)
    session = _session(crop_classify_graph(onnx.load(str(path)), FrameFormat(1920, 1080, "rgb"), CROP_SIZE, "gray"))
    host = _session(path)
    for chosen in (faces, faces[:1], faces[-3:]):  # several faces of several frames, one face, border faces
        ours = session.run(["probs"], _crop_feeds(frames, chosen, cropper, "rgb"))[0]
        crops = np.stack([cropper.face_crop(frames[index], face) for index, face in chosen])
        reference = host.run(["probs"], {"image": crops})[0]
        assert ours.shape == reference.shape == (len(chosen), 7)
        assert np.abs(ours - reference).max() <= 1e-3
        assert (ours.argmax(axis=1) == reference.argmax(axis=1)).all()
    none = {FRAME_INPUT: frames, MATRIX_INPUT: np.zeros((0, 2, 3), np.float32),
            FRAME_INDEX_INPUT: np.zeros(0, np.int64)}
    assert session.run(["probs"], none)[0].shape == (0, 7)


def test_models_that_do_not_fit_are_refused(models: dict[str, Path]) -> None:
    classifier = onnx.load(str(models[f"{CLASSIFIER}.fp32"]))
    frame = FrameFormat(1920, 1080, "bgr")
    with pytest.raises(GraphEditError, match="top_score"):
        detector_frame_graph(classifier, frame, (640, 352))
    with pytest.raises(GraphEditError, match="64"):
        crop_classify_graph(classifier, frame, (48, 48), "gray")
    with pytest.raises(GraphEditError, match="64, 64, 3"):
        crop_classify_graph(classifier, frame, CROP_SIZE, "rgb")
    with pytest.raises(GraphEditError, match="no input 'pixels'"):
        crop_classify_graph(classifier, frame, CROP_SIZE, "gray", classifier_input="pixels")


def test_follow_graphs_correlate_and_sample_as_opencv(perception: object) -> None:
    """modelprep.follow_graphs on the crowd (faces of the first frame searched for in the fourth): the match graph's
    scores are cv2.matchTemplate's TM_CCOEFF_NORMED of the graph's own window and template (to 1e-4), and its best
    place is OpenCV's; each template is the face sampled as cv2.warpAffine samples it (within half a grey level)."""
    from pipeline.modelprep.follow_graphs import FollowGeometry, match_graph, sampling_matrix, template_graph

    frames = _frames("group_1080p.mp4", 2, 3)
    boxes = [face.box for face in perception.analyze(frames[0])[0]]  # type: ignore[attr-defined]
    assert len(boxes) >= 3
    geometry, fmt = FollowGeometry(), FrameFormat(frames.shape[2], frames.shape[1], "bgr")
    k, (ww, wh), (tw, th) = geometry.supersample, geometry.window, geometry.template
    (mx, my) = geometry.margin
    reach = [(mx * (box[2] - box[0]) / tw, my * (box[3] - box[1]) / th) for box in boxes]
    windows = [(box[0] - dx, box[1] - dy, box[2] + dx, box[3] + dy) for box, (dx, dy) in zip(boxes, reach)]
    index = np.zeros(len(boxes), np.int64)

    def cut(size: tuple[int, int], regions: list, frame: np.ndarray) -> np.ndarray:
        session = _session(template_graph(fmt, FollowGeometry(template=size, margin=(0, 0), supersample=k)))
        matrices = np.stack([sampling_matrix(region, size, k) for region in regions])
        return session.run(None, {FRAME_INPUT: frame[None], MATRIX_INPUT: matrices, FRAME_INDEX_INPUT: index})[0]

    templates, seen = cut((tw, th), boxes, frames[0]), cut((ww, wh), windows, frames[1])
    matrices = np.stack([sampling_matrix(window, (ww, wh), k) for window in windows])
    scores = _session(match_graph(fmt, geometry)).run(None, {
        FRAME_INPUT: frames[1][None], MATRIX_INPUT: matrices, FRAME_INDEX_INPUT: index,
        "follow_templates": templates})[0]
    assert scores.shape == (len(boxes), 2 * geometry.margin[1] + 1, 2 * geometry.margin[0] + 1)
    found, grey = 0, cv2.cvtColor(frames[0], cv2.COLOR_BGR2GRAY)
    for face, box in enumerate(boxes):
        expected = cv2.matchTemplate(seen[face], templates[face], cv2.TM_CCOEFF_NORMED)
        assert np.abs(scores[face] - expected).max() < 1e-4
        assert scores[face].argmax() == expected.argmax()
        found += int(expected.max() > 0.8)
        # each template pixel is the grey frame sampled bilinearly where the sampling matrix says (one sample a
        # pixel by default), as cv2.warpAffine samples it (to its 1/32 px grid, from grey rounded to integers)
        matrix = sampling_matrix(box, (tw, th), k)
        sampled = cv2.warpAffine(grey, matrix, (tw * k, th * k), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                                 borderMode=cv2.BORDER_REPLICATE).astype(np.float32)
        sampled = sampled.reshape(th, k, tw, k).mean(axis=(1, 3))
        assert np.abs(sampled - templates[face]).mean() < 0.5
    assert found >= len(boxes) // 2  # most faces are plainly there three frames on
