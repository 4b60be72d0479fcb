"""IoU tracking and per-track smoothing (pipeline/vision/track.py), driven by hand-built detections and a fake clock."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from pipeline.core.types import Detection, EmotionScores
from pipeline.vision.track import IouTracker, box_iou

FPS = 30.0
DT = 1.0 / FPS


def face(x1: float, y1: float, x2: float, y2: float) -> Detection:
    return Detection(box=(float(x1), float(y1), float(x2), float(y2)), score=0.99,
                     landmarks=np.zeros((5, 2), np.float32))


def moved(box: tuple[float, float, float, float], dx: float, dy: float = 0.0) -> Detection:
    x1, y1, x2, y2 = box
    return face(x1 + dx, y1 + dy, x2 + dx, y2 + dy)


def scores(*probs: float) -> EmotionScores:
    return EmotionScores(np.asarray(probs, dtype=np.float32))


# --- box_iou -------------------------------------------------------------------------------------------------------


def test_iou_identical_boxes_is_one_and_disjoint_or_touching_is_zero() -> None:
    assert box_iou((10, 20, 50, 80), (10, 20, 50, 80)) == pytest.approx(1.0, abs=1e-12)
    assert box_iou((10, 20, 50, 80), (100, 100, 120, 130)) == 0.0
    assert box_iou((0, 0, 4, 4), (4, 0, 8, 4)) == 0.0  # only an edge in common


def test_iou_exact_values_and_symmetry() -> None:
    # 4x2 boxes shifted by half their width: inter = 2*2 = 4, union = 8 + 8 - 4 = 12 -> 1/3
    assert box_iou((0, 0, 4, 2), (2, 0, 6, 2)) == pytest.approx(1.0 / 3.0, abs=1e-12)
    # a box containing another of half its area: inter = 50, union = 100 -> 0.5
    assert box_iou((0, 0, 10, 10), (0, 0, 10, 5)) == pytest.approx(0.5, abs=1e-12)
    # quarter overlap in both axes: inter = 5*5 = 25, union = 100 + 100 - 25 = 175
    assert box_iou((0, 0, 10, 10), (5, 5, 15, 15)) == pytest.approx(25.0 / 175.0, abs=1e-12)
    boxes = [(0, 0, 4, 2), (2, 0, 6, 2), (0, 0, 10, 10), (0, 0, 10, 5), (5, 5, 15, 15)]
    for first in boxes:
        for second in boxes:
            assert box_iou(first, second) == pytest.approx(box_iou(second, first), abs=1e-12)


def numpy_greedy_match(faces: list[tuple[float, ...]], tracks: list[tuple[float, ...]], threshold: float) -> list:
    """The tracker's matching as it was written with numpy before 2026-12-01 (IoU matrix, argsort, greedy)."""
    a, b = np.array(faces, dtype=float), np.array(tracks, dtype=float)
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    overlap = inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)
    matched: list = [None] * len(faces)
    for flat in np.argsort(-overlap, axis=None, kind="stable"):
        face_i, track_i = np.unravel_index(flat, overlap.shape)
        if overlap[face_i, track_i] < threshold:
            break
        if matched[face_i] is None and track_i not in matched:
            matched[face_i] = int(track_i)
    return matched


def test_matching_is_the_numpy_greedy_matching_on_random_crowds() -> None:
    """Many random crowds of overlapping faces, moved a little between two frames: the same face gets the same
    track as the numpy formulation it replaced would give (new tracks where that one found none)."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        count = int(rng.integers(1, 9))
        xy = rng.uniform(0, 300, size=(count, 2))
        size = rng.uniform(20, 120, size=(count, 1))
        before = np.hstack([xy, xy + size])
        after = before + rng.normal(0, 15, size=before.shape)
        after = after[rng.permutation(count)][: int(rng.integers(1, count + 1))]
        tracker = IouTracker(iou_threshold=0.3)
        first_ids = tracker.update([face(*box) for box in before], 0.0)
        ids = tracker.update([face(*box) for box in after], DT)
        expected = numpy_greedy_match([tuple(b) for b in after], [tuple(b) for b in before], 0.3)
        for got, track_i in zip(ids, expected):
            if track_i is None:
                assert got not in first_ids
            else:
                assert got == first_ids[track_i]


# --- ids ------------------------------------------------------------------------------------------------------------


def test_id_stable_for_a_face_moving_a_few_pixels_per_frame() -> None:
    tracker = IouTracker(iou_threshold=0.3, max_age_s=1.0)
    box = (100.0, 80.0, 180.0, 180.0)
    ids = []
    for frame in range(30):
        det = moved(box, 3.0 * frame, 2.0 * frame)  # 90 px right, 60 px down overall: far from the start box
        ids.append(tracker.update([det], frame * DT))
    assert all(len(i) == 1 for i in ids)
    assert len({i[0] for i in ids}) == 1
    assert len(tracker.tracks) == 1


def test_crossing_faces_keep_distinct_ids() -> None:
    tracker = IouTracker(iou_threshold=0.3, max_age_s=1.0)
    # A moves right, B moves left on an overlapping row band; they pass through each other around frame 25.
    a0, b0 = (0.0, 0.0, 100.0, 100.0), (200.0, 40.0, 300.0, 140.0)
    prev_a = prev_b = None
    id_a = id_b = None
    for frame in range(50):
        a, b = moved(a0, 4.0 * frame), moved(b0, -4.0 * frame)
        if prev_a is not None:
            # precondition of the scenario: each face overlaps its own previous box more than the other's
            assert box_iou(a.box, prev_a.box) > box_iou(a.box, prev_b.box)
            assert box_iou(b.box, prev_b.box) > box_iou(b.box, prev_a.box)
        order = [a, b] if frame % 2 == 0 else [b, a]  # the list order must not decide the matching
        ids = tracker.update(order, frame * DT)
        got_a, got_b = (ids[0], ids[1]) if frame % 2 == 0 else (ids[1], ids[0])
        if frame == 0:
            id_a, id_b = got_a, got_b
            assert id_a != id_b
        assert (got_a, got_b) == (id_a, id_b), f"frame {frame}"
        prev_a, prev_b = a, b
    # they really crossed: A ended right of where B started
    assert prev_a.box[0] > b0[0] - 50 and prev_b.box[2] < a0[2] + 50


def test_new_face_gets_new_id() -> None:
    tracker = IouTracker()
    first = tracker.update([face(0, 0, 50, 50)], 0.0)
    both = tracker.update([face(1, 0, 51, 50), face(300, 300, 360, 360)], DT)
    assert both[0] == first[0]
    assert both[1] != first[0]
    third = tracker.update([face(2, 0, 52, 50), face(301, 300, 361, 360), face(500, 0, 560, 60)], 2 * DT)
    assert third[:2] == both
    assert len(set(third)) == 3


def test_two_detections_never_share_a_track() -> None:
    tracker = IouTracker(iou_threshold=0.3)
    (tid,) = tracker.update([face(0, 0, 100, 100)], 0.0)
    # two detections both overlapping the one track well: only the better one continues it
    ids = tracker.update([face(5, 0, 105, 100), face(1, 0, 101, 100)], DT)
    assert ids[1] == tid and ids[0] != tid


def test_track_expires_after_max_age_and_reappearing_face_gets_new_id() -> None:
    tracker = IouTracker(max_age_s=0.5)
    box = face(10, 10, 90, 90)
    (old,) = tracker.update([box], 0.0)
    assert tracker.update([], 0.3) == []
    (new,) = tracker.update([box], 0.75)  # unseen for 0.75 s > 0.5 s
    assert new != old


def test_track_within_max_age_keeps_its_id() -> None:
    tracker = IouTracker(max_age_s=0.5)
    box = face(10, 10, 90, 90)
    (old,) = tracker.update([box], 0.0)
    for t in (0.1, 0.2, 0.3):
        assert tracker.update([], t) == []
    (again,) = tracker.update([moved(box.box, 2.0)], 0.5)  # exactly max_age: still alive
    assert again == old
    (later,) = tracker.update([box], 0.95)  # 0.45 s after the last sighting
    assert later == old


def test_low_overlap_starts_a_new_track() -> None:
    tracker = IouTracker(iou_threshold=0.5)
    (a,) = tracker.update([face(0, 0, 4, 2)], 0.0)
    (b,) = tracker.update([face(2, 0, 6, 2)], DT)  # IoU 1/3 < 0.5
    assert b != a


# --- smoothing ------------------------------------------------------------------------------------------------------


OLD = (0.8, 0.0, 0.0, 0.1, 0.0, 0.0, 0.1)
NEW = (0.0, 0.0, 0.0, 0.1, 0.0, 0.2, 0.7)


def _tracker_with_track(half_life_ms: float, t0: float = 5.0) -> tuple[IouTracker, int]:
    tracker = IouTracker(max_age_s=10.0, half_life_ms=half_life_ms)
    (tid,) = tracker.update([face(0, 0, 50, 50)], t0)
    return tracker, tid


def test_first_smoothing_returns_the_scores() -> None:
    tracker, tid = _tracker_with_track(300.0)
    out = tracker.smooth(tid, scores(*OLD), 5.0)
    np.testing.assert_allclose(out.probs, OLD, atol=1e-7)
    assert out.probs.dtype == np.float32


def test_smoothing_one_half_life_is_halfway() -> None:
    tracker, tid = _tracker_with_track(300.0)
    tracker.smooth(tid, scores(*OLD), 5.0)
    out = tracker.smooth(tid, scores(*NEW), 5.3)
    halfway = (np.array(OLD) + np.array(NEW)) / 2
    assert np.allclose(out.probs, halfway, atol=1e-6)
    out = tracker.smooth(tid, scores(*NEW), 5.6)  # another half-life: three quarters of the way
    assert np.allclose(out.probs, 0.25 * np.array(OLD) + 0.75 * np.array(NEW), atol=1e-6)
    assert out.emotion == "neutral"


def test_zero_half_life_means_no_smoothing() -> None:
    tracker, tid = _tracker_with_track(0.0)
    tracker.smooth(tid, scores(*OLD), 5.0)
    out = tracker.smooth(tid, scores(*NEW), 5.01)
    np.testing.assert_allclose(out.probs, NEW, atol=1e-7)


def test_smoothing_is_frame_rate_independent() -> None:
    slow, slow_id = _tracker_with_track(300.0)
    fast, fast_id = _tracker_with_track(300.0)
    slow.smooth(slow_id, scores(*OLD), 5.0)
    fast.smooth(fast_id, scores(*OLD), 5.0)
    one_step = slow.smooth(slow_id, scores(*NEW), 5.3)
    for k in range(1, 11):
        ten_steps = fast.smooth(fast_id, scores(*NEW), 5.0 + 0.03 * k)
    np.testing.assert_allclose(ten_steps.probs, one_step.probs, atol=1e-6)
    # and both differ clearly from the unsmoothed input (the check above is not trivially true)
    assert np.abs(one_step.probs - np.array(NEW)).max() > 0.3


def test_smoothing_is_per_track() -> None:
    tracker = IouTracker(half_life_ms=300.0)
    a, b = tracker.update([face(0, 0, 50, 50), face(200, 200, 250, 250)], 0.0)
    tracker.smooth(a, scores(*OLD), 0.0)
    tracker.smooth(b, scores(*NEW), 0.0)
    out_a = tracker.smooth(a, scores(*NEW), 0.3)
    out_b = tracker.smooth(b, scores(*NEW), 0.3)
    assert np.allclose(out_a.probs, (np.array(OLD) + np.array(NEW)) / 2, atol=1e-6)
    assert np.allclose(out_b.probs, NEW, atol=1e-6)


# --- following faces between detections (detector.interval) ---------------------------------------------------------


def test_predict_moves_each_face_at_its_velocity_and_keeps_its_landmarks_in_place() -> None:
    tracker = IouTracker(follow=True)
    first = Detection((100.0, 50.0, 160.0, 130.0), 0.9, np.array([[110.0, 70.0]] * 5, np.float32))
    (track_id,) = tracker.update([first], 0.0)
    second = Detection(moved(first.box, 6.0, -3.0).box, 0.9, first.landmarks + np.float32([6.0, -3.0]))
    tracker.update([second], DT)  # 180 px/s right, 90 px/s up
    (got_id, predicted), = tracker.predict(3 * DT)
    assert got_id == track_id
    assert predicted.box == pytest.approx((118.0, 41.0, 178.0, 121.0), abs=1e-6)  # two more frames on
    assert predicted.landmarks[0] == pytest.approx((118.0 + 10.0, 41.0 + 20.0), abs=1e-4)


def test_predict_never_keeps_a_track_alive() -> None:
    tracker = IouTracker(max_age_s=0.5, follow=True)
    tracker.update([face(0, 0, 50, 50)], 0.0)
    assert len(tracker.predict(0.4)) == 1
    assert tracker.predict(0.6) == []  # only detections count: 0.6 s after the last one the face is gone
    (new_id,) = tracker.update([face(0, 0, 50, 50)], 0.7)
    assert new_id != 1


def test_following_matches_a_face_that_moved_more_than_its_width() -> None:
    """A face 40 px wide that moved 50 px between two detections overlaps nothing: following matches it by distance
    (and the same tracker without following starts a new track, as it always did)."""
    for follow, same in ((True, True), (False, False)):
        tracker = IouTracker(follow=follow)
        (first,) = tracker.update([face(100, 100, 140, 150)], 0.0)
        (second,) = tracker.update([face(150, 104, 190, 154)], 3 * DT)
        assert (second == first) is same


def test_following_finds_the_face_by_its_look() -> None:
    """A textured patch that jumps sideways while the motion model expects it to stand still is found where it went
    (template matching on the frame); on a blank frame the motion model's guess stands."""
    rng = np.random.default_rng(3)
    patch = rng.integers(0, 255, (60, 48, 3), dtype=np.uint8)
    frame0 = np.full((240, 320, 3), 90, np.uint8)
    frame0[100:160, 100:148] = patch
    frame1 = np.full((240, 320, 3), 90, np.uint8)
    frame1[104:164, 124:172] = patch  # 24 px right, 4 down
    tracker = IouTracker(follow=True)
    tracker.update([face(100, 100, 148, 160)], 0.0, frame0)
    ((_, found),) = tracker.predict(DT, frame1)
    assert found.box == pytest.approx((124.0, 104.0, 172.0, 164.0), abs=2.5)
    tracker = IouTracker(follow=True)
    tracker.update([face(100, 100, 148, 160)], 0.0, frame0)
    ((_, guessed),) = tracker.predict(DT, np.full_like(frame1, 90))
    assert guessed.box == pytest.approx((100.0, 100.0, 148.0, 160.0))


def test_predict_follows_only_the_faces_the_last_detection_found() -> None:
    """A face the detector missed on its last run is not reported between detections (as every-frame detection
    would not report it), yet its track lives on and takes the face back when the detector finds it again."""
    tracker = IouTracker(max_age_s=1.0, follow=True)
    first, second = tracker.update([face(0, 0, 50, 50), face(200, 0, 250, 50)], 0.0)
    assert {track_id for track_id, _ in tracker.predict(0.04)} == {first, second}
    (again,) = tracker.update([face(0, 0, 50, 50)], 0.12)  # the second face missed on this run
    assert again == first
    assert [track_id for track_id, _ in tracker.predict(0.16)] == [first]
    assert tracker.update([face(0, 0, 50, 50), face(200, 0, 250, 50)], 0.24) == [first, second]
    assert {track_id for track_id, _ in tracker.predict(0.28)} == {first, second}


def test_following_places_the_face_between_template_pixels() -> None:
    """The face is matched at 24 px wide, so one template pixel is 4 frame pixels of a 96 px face; the peak of the
    match is placed between pixels (a parabola through its neighbours), so a face that moved by 2 px more than a
    whole template pixel is placed within a pixel of where it went, not on the nearest template pixel."""
    rng = np.random.default_rng(5)
    texture = cv2.GaussianBlur(rng.integers(0, 255, (120, 96), dtype=np.uint8), (0, 0), 6)
    patch = cv2.normalize(texture, None, 0, 255, cv2.NORM_MINMAX).astype(np.uint8)
    frame0 = np.full((360, 480), 90, np.uint8)
    frame0[100:220, 100:196] = patch
    frame1 = np.full((360, 480), 90, np.uint8)
    frame1[106:226, 130:226] = patch  # 30 px right (7.5 template pixels), 6 down (1.5)
    tracker = IouTracker(follow=True)
    tracker.update([face(100, 100, 196, 220)], 0.0, frame0)
    ((_, found),) = tracker.predict(DT, frame1)
    assert found.box == pytest.approx((130.0, 106.0, 226.0, 226.0), abs=1.0)


def test_the_match_s_peak_is_placed_between_pixels_only_where_it_is_a_peak() -> None:
    """The parabola's vertex for a real peak (towards the higher neighbour, at most half a pixel); none for a flat,
    rising, edge or undefined neighbourhood (matchTemplate scores a flat patch NaN), so a box never becomes NaN."""
    from pipeline.vision.follow import best_places

    def place(row: list[float]) -> float:  # the best x of one row of scores
        best, xs, ys = best_places(np.array([[row]], np.float32))
        assert ys[0] == 0.0 and np.isfinite(best[0])
        return float(xs[0])

    assert place([0.5, 1.0, 0.5]) == 1.0
    assert place([0.9, 1.0, 0.5]) == pytest.approx(1 - 1 / 3)
    assert place([0.5, 1.0, 0.9]) == pytest.approx(1 + 1 / 3)
    assert place([1.0, 1.0, 1.0]) == 0.0  # flat: the first best, where it is
    assert place([float("nan"), 1.0, 0.5]) == 1.0
    assert place([0.2, 0.5, 0.9]) == 2.0  # rising to the edge: the edge
    best, xs, ys = best_places(np.array([[[0.1, 0.2, 0.1], [0.2, 0.9, 0.3], [0.1, 0.5, 0.1]],
                                         [[np.nan] * 3] * 3], np.float32))
    assert best[0] == pytest.approx(0.9, abs=1e-6) and xs[0] == pytest.approx(1 + 0.05 / 1.3) and ys[0] > 1.0
    assert best[1] == -np.inf  # nothing to find: never above a threshold


class _WindowedFrame:
    """A frame as the GPU frame path holds it (a core.types.DeviceImage), its pixels kept here in host memory: the GPU
    is a boundary these tests cannot have (tests/test_nvdec.py runs NVDEC's own on one). It records the windows read
    and refuses the whole-frame copy, so a test sees that following asks for windows alone."""

    def __init__(self, bgr: np.ndarray) -> None:
        self._bgr = bgr
        self.calls: list[list[tuple[int, int, int, int]]] = []  # the windows asked for, call by call

    @property
    def shape(self) -> tuple[int, int, int]:
        height, width, channels = self._bgr.shape
        return height, width, channels

    @property
    def order(self) -> str:
        return "rgb"

    @property
    def ptr(self) -> int:
        raise AssertionError("following never reads the frame's device memory directly")

    def to_host(self) -> np.ndarray:
        raise AssertionError("following copies windows, never the whole frame")

    def windows(self, boxes: list[tuple[int, int, int, int]]) -> list[np.ndarray]:
        self.calls.append(list(boxes))
        return [self._bgr[y1:y2, x1:x2].copy() for x1, y1, x2, y2 in boxes]


def _jumping_patch() -> tuple[np.ndarray, np.ndarray]:
    """Two 240x320 frames: a textured 48x60 patch at (100, 100), then 24 px right and 4 down."""
    patch = np.random.default_rng(3).integers(0, 255, (60, 48, 3), dtype=np.uint8)
    frame0, frame1 = np.full((240, 320, 3), 90, np.uint8), np.full((240, 320, 3), 90, np.uint8)
    frame0[100:160, 100:148] = patch
    frame1[104:164, 124:172] = patch
    return frame0, frame1


def test_which_frames_a_follower_searches_follows_tracking_follow_by() -> None:
    """auto searches host frames and leaves frames on the GPU to the motion; look searches both; motion neither;
    a tracker that does not follow (every frame detected) never keeps a face's look."""
    host, device = np.zeros((8, 8, 3), np.uint8), _WindowedFrame(np.zeros((8, 8, 3), np.uint8))
    expected = {"auto": (host, None), "look": (host, device), "motion": (None, None)}
    for follow_by, (on_host, on_device) in expected.items():
        tracker = IouTracker(follow=True, follow_by=follow_by)  # type: ignore[arg-type]
        assert tracker.searchable(host) is on_host and tracker.searchable(device) is on_device, follow_by
    assert IouTracker(follow=False, follow_by="look").searchable(host) is None


def test_faces_on_a_gpu_frame_are_found_from_windows_as_on_the_host() -> None:
    """tracking.follow_by look on frames that stay on the GPU: the faces' templates and their search areas come down
    as windows, every face of a frame in one call (one round trip), each well under the frame, and the faces are
    found exactly where the host frame puts them."""
    frame0, frame1 = _jumping_patch()
    still = np.random.default_rng(4).integers(0, 255, (60, 48, 3), dtype=np.uint8)
    frame0[20:80, 230:278] = frame1[20:80, 230:278] = still  # a second face that stays put
    faces = [face(100, 100, 148, 160), face(230, 20, 278, 80)]
    found, device_frames = [], (_WindowedFrame(frame0), _WindowedFrame(frame1))
    for first, second in ((frame0, frame1), device_frames):
        tracker = IouTracker(follow=True, follow_by="look")
        tracker.update(faces, 0.0, tracker.searchable(first))
        found.append([moved_to.box for _, moved_to in tracker.predict(DT, tracker.searchable(second))])
    assert found[1] == found[0]
    assert found[0][0] == pytest.approx((124.0, 104.0, 172.0, 164.0), abs=2.5)
    assert found[0][1] == pytest.approx((230.0, 20.0, 278.0, 80.0), abs=0.5)
    (templates,), (searched,) = device_frames[0].calls, device_frames[1].calls
    assert len(templates) == len(searched) == 2
    assert all((x2 - x1) * (y2 - y1) < 0.2 * 240 * 320 for x1, y1, x2, y2 in templates + searched)


def test_following_by_motion_alone_ignores_the_frame() -> None:
    """follow_by motion: the same patch is not searched for; the face stays where its motion puts it."""
    frame0, frame1 = _jumping_patch()
    tracker = IouTracker(follow=True, follow_by="motion")
    tracker.update([face(100, 100, 148, 160)], 0.0, tracker.searchable(frame0))
    ((_, guessed),) = tracker.predict(DT, tracker.searchable(frame1))
    assert guessed.box == pytest.approx((100.0, 100.0, 148.0, 160.0))
