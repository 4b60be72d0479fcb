"""Decoding on the GPU's NVDEC (camera key `decode`): the choice between GPU and CPU everywhere, and the NVDEC source
itself against FFmpeg's CPU decoding on real videos where PyNvVideoCodec and a GPU exist (the lent H200)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from pipeline.capture.nvdec import nvdec_problem, reorders_frames
from pipeline.capture.settings import CameraConfig
from pipeline.capture.source_base import SourceEnded, SourceError, VideoSource
from pipeline.capture.sources import DemoSource, FileSource, open_source
from pipeline.config.app import ConfigError, parse_config
from tests.conftest import data_path, nvdec_frames

NVDEC_PROBLEM = nvdec_problem()
needs_nvdec = pytest.mark.skipif(NVDEC_PROBLEM is not None, reason=f"NVDEC decoding unavailable: {NVDEC_PROBLEM}")
without_nvdec = pytest.mark.skipif(NVDEC_PROBLEM is None, reason="PyNvVideoCodec and a GPU are present here")


def _camera(source: Path | str, decode: str = "auto", loop: bool = False) -> CameraConfig:
    return CameraConfig(name="cam", source=str(source), decode=decode, loop=loop)


def _cpu_frames(video: Path, count: int) -> list[np.ndarray]:
    """Up to `count` frames decoded by FFmpeg on the CPU (fewer when the file is shorter)."""
    source = FileSource(video, loop=False)
    source._pacer.period = 0.0  # type: ignore[attr-defined]  # no need to wait in real time
    frames: list[np.ndarray] = []
    try:
        while len(frames) < count:
            source.grab(1.0)
            frames.append(source.retrieve())
    except SourceEnded:
        pass
    finally:
        source.close()
    return frames


# ---------------------------------------------------------------- the choice (everywhere)


def test_decode_key_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"cameras\[0\]\.decode"):
        parse_config("cameras:\n  - {name: cam, source: demo, decode: nvdec}\n")


def test_auto_decodes_on_the_cpu_when_the_models_do() -> None:
    source = open_source(_camera(data_path("video", "woman_short.mp4")), gpu_active=False)
    try:
        assert isinstance(source, FileSource)
    finally:
        source.close()


def test_usb_and_demo_never_go_to_the_gpu() -> None:
    source = open_source(CameraConfig(name="cam", source="demo", decode="gpu"), gpu_active=True)
    assert isinstance(source, DemoSource)


@without_nvdec
def test_auto_falls_back_to_the_cpu_with_a_reason(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pipeline.capture.sources")
    source = open_source(_camera(data_path("video", "woman_short.mp4")), gpu_active=True)
    try:
        assert isinstance(source, FileSource)
    finally:
        source.close()
    lines = [r.getMessage() for r in caplog.records if "decoding on the CPU" in r.getMessage()]
    assert lines and NVDEC_PROBLEM in lines[0]


@without_nvdec
def test_gpu_requested_but_unavailable_is_a_clear_source_error() -> None:
    with pytest.raises(SourceError) as caught:
        open_source(_camera(data_path("video", "woman_short.mp4"), decode="gpu"), gpu_active=False)
    text = str(caught.value)
    assert "decode gpu requested" in text and "woman_short.mp4" in text
    assert "PyNvVideoCodec" in text or "CUDA" in text or "cuda" in text


# ---------------------------------------------------------------- NVDEC itself (GPU machine)


@pytest.mark.parametrize(("stamps", "reorders"), [
    ([0, 2048, 1024, 512, 1536, 4096, 3072, 2560], True),  # group_1080p.mp4's first packets (x264, B-frames)
    ([0, 512, 1024, 1536, 2048, 2560, 3072, 3584], False),  # the same clip encoded with -bf 0 (IPPP, as IP cameras)
    ([0, 0, 0, 0], True),  # times missing: keep display order
    ([7], True),  # one packet cannot tell
])
def test_packets_marked_end_of_picture_only_without_b_frames(stamps: list[int], reorders: bool) -> None:
    """Marking each packet end-of-picture (a frame out for every packet in) breaks the display order of B-frame
    streams: only strictly rising presentation times in decoding order let a source mark them."""
    assert reorders_frames(stamps) is reorders


@pytest.mark.gpu
@needs_nvdec
@pytest.mark.parametrize("clip", ["woman2.mp4", "group_1080p.mp4"])  # both with B-frames (decoded in LOW mode)
def test_nvdec_frames_match_ffmpeg_on_the_cpu(clip: str) -> None:
    """Same pictures as FFmpeg's, in the same (display) order: each frame is closer to FFmpeg's frame at its own
    position than to the ones before and after it."""
    video = data_path("video", clip)
    expected = _cpu_frames(video, 30)
    source = open_source(_camera(video, decode="gpu"), gpu_active=True)
    try:
        assert "NVDEC" in source.describe()
        got = [source.retrieve() for _ in range(len(expected)) if source.grab(1.0)]
    finally:
        source.close()
    assert len(got) == len(expected) == 30

    def mean_difference(ours: np.ndarray, theirs: np.ndarray) -> float:
        return float(np.abs(ours.astype(np.int16) - theirs.astype(np.int16)).mean())

    for index, ours in enumerate(got):
        assert ours.shape == expected[index].shape and ours.dtype == np.uint8
        own = mean_difference(ours, expected[index])
        assert own < 3.0, own  # YUV→BGR conversions differ by rounding only
        for neighbour in (index - 1, index + 1):
            if 0 <= neighbour < len(expected):
                assert own <= mean_difference(ours, expected[neighbour]), (index, neighbour)


@pytest.mark.gpu
@needs_nvdec
def test_nvdec_file_ends_or_loops_on_one_decoder() -> None:
    video = data_path("video", "woman_short.mp4")
    total = len(_cpu_frames(video, 10_000))
    ending = open_source(_camera(video, decode="gpu"), gpu_active=True)
    ending._pacer = None  # type: ignore[attr-defined]  # the test need not wait in real time
    count = 0
    with pytest.raises(SourceEnded):
        while ending.grab(1.0):
            count += 1
    ending.close()
    assert abs(count - total) <= 1, (count, total)

    looping = open_source(_camera(video, decode="gpu", loop=True), gpu_active=True)
    looping._pacer = None  # type: ignore[attr-defined]
    decoder = looping._decoder  # type: ignore[attr-defined]
    try:
        for _ in range(total * 2 + 5):
            assert looping.grab(1.0)
        assert looping._decoder is decoder  # type: ignore[attr-defined]  # kept across loops
        assert looping.retrieve().shape[2] == 3
    finally:
        looping.close()


@pytest.mark.gpu
@needs_nvdec
def test_the_frames_a_decoder_returned_at_once_are_counted_while_it_is_open() -> None:
    """decoder_output_frames: each open decoder's most frames from one Decode call (PyNvVideoCodec keeps that many RGB
    output frames), over two loops of a B-frame file; given back when the source closes."""
    from pipeline.capture.nvdec import decoder_output_frames

    video = data_path("video", "woman_short.mp4")
    total = len(_cpu_frames(video, 10_000))
    before = decoder_output_frames()
    looping = open_source(_camera(video, decode="gpu", loop=True), gpu_active=True)
    looping._pacer = None  # type: ignore[attr-defined]
    try:
        for _ in range(total * 2 + 5):
            assert looping.grab(1.0)
        now = decoder_output_frames()
    finally:
        looping.close()
    frames = now["frames"] - before["frames"]
    print("one looped decoder:", {key: now[key] - before[key] for key in now})
    assert now["decoders"] - before["decoders"] == 1
    assert frames >= 1 and now["bytes"] - before["bytes"] == frames * 596 * 336 * 3
    assert (frames >= 2) == (now["calls_with_several"] > before["calls_with_several"])
    several = now["calls_with_several"] - before["calls_with_several"]
    assert now["several_at_loop"] - before["several_at_loop"] <= several
    after = decoder_output_frames()  # what the closed decoder kept is given back; the call counts stay
    assert {key: after[key] for key in ("decoders", "frames", "bytes")} == \
        {key: before[key] for key in ("decoders", "frames", "bytes")}


@pytest.mark.gpu
@needs_nvdec
def test_faces_and_emotions_agree_with_cpu_decoding(perception: object) -> None:
    video = data_path("video", "woman2.mp4")
    expected = _cpu_frames(video, 40)[::4]
    source = open_source(_camera(video, decode="gpu"), gpu_active=True)
    try:
        frames = [source.retrieve() for _ in range(40) if source.grab(1.0)][::4]
    finally:
        source.close()
    same_count, same_top, faces = 0, 0, 0
    for ours, theirs in zip(frames, expected):
        faces_a, scores_a, _ = perception.analyze(ours)  # type: ignore[attr-defined]
        faces_b, scores_b, _ = perception.analyze(theirs)  # type: ignore[attr-defined]
        same_count += len(faces_a) == len(faces_b)
        for a, b in zip(scores_a, scores_b):
            faces += 1
            same_top += a.emotion == b.emotion
    assert same_count == len(expected) and faces > 0
    assert same_top >= 0.9 * faces


@pytest.mark.gpu
@needs_nvdec
def test_faces_on_nvdec_frames_are_followed_by_look_from_windows_as_on_their_host_copies(perception: object) -> None:
    """tracking.follow_by look on frames that stay on the GPU: windows of an NVDEC frame (fetched together on the
    worker's own stream) are the same pixels as those parts of the frame copied down whole, and the crowd's faces are
    found where the host copies put them."""
    from pipeline.vision.track import IouTracker

    frames = nvdec_frames(data_path("video", "group_1080p.mp4"), 6)
    hosts = [frame.to_host() for frame in frames]
    first, second = frames[0].windows([(101, 37, 357, 211), (0, 0, 1920, 1080)])
    assert np.array_equal(first, hosts[0][37:211, 101:357]) and np.array_equal(second, hosts[0])
    with pytest.raises(ValueError, match="not inside"):
        frames[0].windows([(0, 0, 10, 10), (-1, 0, 10, 10)])
    faces = perception.analyze(hosts[0])[0]  # type: ignore[attr-defined]
    assert len(faces) >= 3
    on_gpu, on_host, by_motion = (IouTracker(follow=True, follow_by=way) for way in ("look", "look", "motion"))
    for tracker, first in ((on_gpu, frames[0]), (on_host, hosts[0]), (by_motion, hosts[0])):
        tracker.update(faces, 0.0, tracker.searchable(first))
    moved_by_look = 0
    for index in range(1, len(frames)):
        now = index / 25.0
        gpu_boxes = [face.box for _, face in on_gpu.predict(now, on_gpu.searchable(frames[index]))]
        host_boxes = [face.box for _, face in on_host.predict(now, on_host.searchable(hosts[index]))]
        motion_boxes = [face.box for _, face in by_motion.predict(now, by_motion.searchable(hosts[index]))]
        assert gpu_boxes == host_boxes, index
        moved_by_look += sum(a != b for a, b in zip(host_boxes, motion_boxes))
    assert moved_by_look > 0  # the look moved some face off its motion's guess: the windows were searched


@pytest.mark.gpu
@needs_nvdec
def test_faces_on_nvdec_frames_are_followed_on_the_gpu_as_the_follow_graphs_follow_them_on_the_cpu(
        perception: object) -> None:
    """The follow graphs on the GPU (inference.following; measured, not the daemon's way): NVDEC frames are searched
    in place, `auto` searches them with such a follower, and the crowd's faces are found where the same graphs on
    the CPU put them on the frames' host copies (within a quarter pixel: only float rounding differs), away from the
    motion's guess."""
    from pipeline.inference.following import cpu_graph_follower, cuda_graph_follower
    from pipeline.inference.onnxruntime import import_ort
    from pipeline.inference.settings import InferenceConfig
    from pipeline.vision.track import IouTracker

    frames = nvdec_frames(data_path("video", "group_1080p.mp4"), 6)
    hosts = [frame.to_host() for frame in frames]
    faces = perception.analyze(hosts[0])[0]  # type: ignore[attr-defined]
    assert len(faces) >= 3
    on_gpu, on_cpu = cuda_graph_follower(import_ort(), InferenceConfig(device="cuda")), cpu_graph_follower()
    gpu_tracker, cpu_tracker, by_motion = (IouTracker(follow=True, follow_by=way) for way in ("auto", "look", "motion"))
    try:
        assert gpu_tracker.searchable(frames[0], on_gpu) is frames[0]  # auto searches GPU frames with this follower
        gpu_tracker.update(faces, 0.0, frames[0], on_gpu)
        cpu_tracker.update(faces, 0.0, hosts[0], on_cpu)
        by_motion.update(faces, 0.0)
        moved_by_look = 0
        for index in range(1, len(frames)):
            now = index / 25.0
            gpu_boxes = np.array([face.box for _, face in gpu_tracker.predict(now, frames[index], on_gpu)])
            cpu_boxes = np.array([face.box for _, face in cpu_tracker.predict(now, hosts[index], on_cpu)])
            motion_boxes = np.array([face.box for _, face in by_motion.predict(now)])
            assert gpu_boxes.shape == cpu_boxes.shape == motion_boxes.shape
            assert np.abs(gpu_boxes - cpu_boxes).max() < 0.25, index
            moved_by_look += int((np.abs(gpu_boxes - motion_boxes).max(axis=1) > 1.0).sum())
        assert moved_by_look > 0
    finally:
        on_gpu.close()


@pytest.mark.gpu
@needs_nvdec
def test_faces_on_nvdec_frames_are_found_by_their_look_in_the_cuda_lanes_batches(prepared_models: None,
                                                                                 app_config: object) -> None:
    """The daemon's way on the CUDA frame graphs path (inference.batch_search): NVDEC frames' followed faces are
    searched inside the lanes' batches and land where the follow graphs on the CPU put them on the frames' host
    copies (tests/test_batch_search.follow_in_batches), most found by their look."""
    from tests.test_batch_search import follow_in_batches
    from tests.test_frames_path import _prepared_gpu

    frames = nvdec_frames(data_path("video", "group_1080p.mp4"), 6)
    hosts = [frame.to_host() for frame in frames]
    perception = _prepared_gpu(app_config, frames[0])
    try:
        assert follow_in_batches(perception, frames, hosts) >= 10
    finally:
        perception.close()


# ---------------------------------------------------------------- the frame pools' ledger (everywhere)

class _CudaRuntimeStandIn:
    """cuda-python's runtime where no GPU exists: addresses handed out and taken back, nothing copied. Only the
    calls DevicePool makes; `fail_free` makes cudaFree report an error, as on a GPU that has failed."""

    def __init__(self) -> None:
        self.live: set[int] = set()
        self.most = 0  # the most buffers allocated at once
        self.next = 0x1000
        self.fail_free = False

    def cudaMalloc(self, nbytes: int) -> tuple[int, int]:  # noqa: N802 - cuda-python's name
        self.next += nbytes
        self.live.add(self.next)
        self.most = max(self.most, len(self.live))
        return 0, self.next

    def cudaFree(self, ptr: int) -> tuple[int]:  # noqa: N802
        if self.fail_free:
            return (999,)
        self.live.remove(ptr)
        return (0,)


def test_frame_pools_count_what_they_hold_on_the_gpu() -> None:
    """bench memory's split of "cameras decoding" into NVDEC's surfaces and our frame pools: the ledger follows every
    pool's buffers (allocated, reused, freed at close or when the last image goes) and keeps the largest count."""
    from pipeline.capture.nvdec import DevicePool, frame_pool_allocations

    before = frame_pool_allocations()
    runtime = _CudaRuntimeStandIn()
    pool = DevicePool("cam", 1000, runtime, stream=None)
    held = [pool.acquire() for _ in range(3)]
    pool.release(held.pop())
    held.append(pool.acquire())  # the released buffer again: no new allocation
    now = frame_pool_allocations()
    assert now["buffers"] - before["buffers"] == 3 and now["bytes"] - before["bytes"] == 3000
    assert now["peak_buffers"] >= before["buffers"] + 3
    assert now["in_use"] - before["in_use"] == 3 and now["peak_in_use"] >= before["in_use"] + 3
    pool.release(held.pop())
    assert frame_pool_allocations()["in_use"] - before["in_use"] == 2  # idle now, still allocated
    pool.close()  # the idle buffer is freed now, the two still held when they come back
    assert frame_pool_allocations()["buffers"] - before["buffers"] == 2
    runtime.fail_free = True
    pool.release(held.pop())  # a failed cudaFree is logged and not counted as freed
    runtime.fail_free = False
    pool.release(held.pop())
    after = frame_pool_allocations()
    assert after["buffers"] - before["buffers"] == 1 and after["bytes"] - before["bytes"] == 1000
    assert after["in_use"] == before["in_use"]  # every image gone (the failed free's buffer too)
    assert len(runtime.live) == 1


def test_a_pool_frees_what_a_slow_spell_grew_once_idle() -> None:
    """A spell of slow analysis grows a camera's pool; once the camera needs fewer buffers again, the extras lie
    idle and are freed one an acquire after DevicePool.IDLE_S, while the buffers still cycling are kept."""
    from pipeline.capture.nvdec import DevicePool

    now = [0.0]
    runtime = _CudaRuntimeStandIn()
    pool = DevicePool("cam", 1000, runtime, stream=None, clock=lambda: now[0])
    spell = [pool.acquire() for _ in range(6)]  # six frames held at once
    for buffer in spell:
        pool.release(buffer)
    for _ in range(100):  # then three at a time, for a minute: 3 s a round
        held = [pool.acquire() for _ in range(3)]
        now[0] += 3.0
        for buffer in held:
            pool.release(buffer)
        if now[0] < DevicePool.IDLE_S:
            assert pool.buffers == 6
    assert pool.buffers == 3 and len(runtime.live) == 3
    pool.close()
    assert not runtime.live


def test_cameras_of_one_frame_size_reuse_each_others_idle_buffers() -> None:
    """Two cameras hold two frames each and burst to a third at different moments: the second burst reuses the
    buffer the first let go (5 buffers, not 6 as pools of their own kept). A frame size or GPU of its own shares
    nothing; the idle buffers outlive a closing camera while another of their size runs, and go with the last."""
    from pipeline.capture.nvdec import DevicePool

    runtime = _CudaRuntimeStandIn()
    cam_a, cam_b = DevicePool("a", 1000, runtime, stream=None), DevicePool("b", 1000, runtime, stream=None)
    held_a = [cam_a.acquire() for _ in range(2)]
    held_b = [cam_b.acquire() for _ in range(2)]
    burst = cam_a.acquire()
    cam_a.release(burst)
    held_b.append(cam_b.acquire())
    assert held_b[-1] == burst and runtime.most == 5
    other_size = DevicePool("c", 2000, runtime, stream=None)
    other_gpu = DevicePool("d", 1000, runtime, stream=None, gpu=1)
    cam_b.release(held_b.pop())
    taken = [other_size.acquire(), other_gpu.acquire()]
    assert burst not in taken and len(runtime.live) == 7
    for buffer in held_a:
        cam_a.release(buffer)
    cam_a.close()
    assert len(runtime.live) == 7 and cam_b.buffers == 2 + 3  # a's two and b's burst, idle for b's size
    cam_b.close()  # the last of size 1000 on GPU 0: its idle buffers are freed, b's held two when they come back
    assert len(runtime.live) == 4
    for buffer in held_b:
        cam_b.release(buffer)
    other_size.release(taken[0])
    other_gpu.release(taken[1])
    other_size.close()
    other_gpu.close()
    assert not runtime.live


@pytest.mark.gpu
@needs_nvdec
def test_a_pool_on_the_gpu_gives_its_idle_buffers_back_to_cuda() -> None:
    """The same slow spell over CUDA's own runtime (the lent H200): the buffers a pool frees once idle are given
    back to the device, as cudaMemGetInfo sees it, and the ones still cycling stay. Only the clock is faked."""
    from pipeline.capture.nvdec import DevicePool
    from pipeline.inference.gpu.cuda import load_runtime, memory_info

    now = [0.0]
    frame = 1920 * 1080 * 3
    pool = DevicePool("cam", frame, load_runtime(), stream=None, clock=lambda: now[0])
    try:
        free_before = memory_info()[0]
        spell = [pool.acquire() for _ in range(6)]
        grown = free_before - memory_info()[0]
        for buffer in spell:
            pool.release(buffer)
        for _ in range(20):  # then three at a time: 3 s a round, a minute in all
            held = [pool.acquire() for _ in range(3)]
            now[0] += 3.0
            for buffer in held:
                pool.release(buffer)
        given_back = memory_info()[0] - (free_before - grown)
        assert pool.buffers == 3
        assert grown >= 6 * frame and given_back >= 3 * frame  # CUDA rounds allocations up, never down
    finally:
        pool.close()


class _PooledCamera(VideoSource):
    """A camera (the boundary) whose frames, like NvdecSource's kept on the GPU, each fill a buffer of a DevicePool
    over the CUDA stand-in: a new frame every 5 ms, nothing copied."""

    kind = "pooled stand-in"

    def __init__(self, pool: object) -> None:
        self.pool = pool

    @property
    def frames_pooled(self) -> bool:
        return True

    def grab(self, timeout: float) -> bool:
        time.sleep(0.005)
        return True

    def retrieve(self) -> object:
        from pipeline.capture.nvdec import NvdecImage

        return NvdecImage(self.pool, self.pool.acquire(), (2, 2, 3))  # type: ignore[arg-type]

    def describe(self) -> str:
        return "pooled stand-in"


def test_a_camera_with_two_frames_in_flight_keeps_three_pool_buffers() -> None:
    """The capture reader lets go of the slot's untaken frame before the source fills the next, so a camera whose
    worker holds two frames (two in flight) while newer ones keep arriving needs three buffers, not four (the held
    two, the untaken newest, the one being filled): 6.2 MB of GPU memory less per 1080p camera."""
    from pipeline.capture.nvdec import DevicePool
    from pipeline.capture.thread import CaptureThread

    runtime = _CudaRuntimeStandIn()
    pool = DevicePool("cam", 1000, runtime, stream=None)
    stop = threading.Event()
    cfg = CameraConfig(name="cam", source="stand-in", fps=120)
    capture = CaptureThread(cfg, stop, lambda event: None, source_factory=lambda _cfg: _PooledCamera(pool))
    capture.start()
    in_flight: deque[object] = deque()  # a worker with two frames in flight: it takes one as the oldest finishes
    last, deadline = -1, time.monotonic() + 1.5
    try:
        while time.monotonic() < deadline:
            if len(in_flight) == 2:
                in_flight.popleft()
            frame = capture.slot.take_newer(last, timeout=0.5)
            if frame is not None:
                in_flight.append(frame)
                last = frame.index
            del frame
            time.sleep(0.025)
    finally:
        stop.set()
        capture.join(5)
    assert capture.slot.taken >= 20 and capture.slot.published > capture.slot.taken + 10  # frames went untaken
    assert runtime.most == 3


def test_the_slot_drops_only_a_frame_no_worker_took() -> None:
    from pipeline.capture.thread import FrameSlot
    from pipeline.core.types import Frame

    slot = FrameSlot()
    slot.put(Frame("cam", 1, np.zeros((2, 2, 3), np.uint8), 0.0, 0.0))
    slot.drop_untaken()
    assert slot.latest is None and slot.take_newer(0, timeout=0.01) is None
    slot.put(Frame("cam", 2, np.zeros((2, 2, 3), np.uint8), 0.0, 0.0))
    taken = slot.take_newer(0, timeout=0.01)
    slot.drop_untaken()  # a worker holds it: it stays the newest
    assert taken is not None and slot.latest is taken
