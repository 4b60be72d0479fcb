"""The `detector:`, `emotion:` and `inference:` sections: which models run, how, where, and how they are batched.

Owned by the inference wing (Perception and the backends read them); the configuration file composes them.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import (
    Discriminator,
    Field,
    SecretStr,
    Tag,
    field_validator,
    model_validator,
)

from pipeline.core.settings import MISSING, ConfigValueError, StrictModel
from pipeline.inference.gpu.tensorrt import TensorRTSettings
from pipeline.vision.retinaface import auto_input_size

AUTO = "auto"
# inference.max_faces_per_run: auto gives each frame of a full batch room for this many crops (4 faces, mirrored), up
# to this many crops a run.
AUTO_FACES_PER_FRAME = 8
AUTO_FACES_MOST = 256


def _input_kind(value: object) -> str:
    return AUTO if isinstance(value, str) else "size"


# `auto` or [width, height]; the discriminator keeps a bad size's error to the size (`input_size[1]: must be a valid
# integer`) instead of adding "must be one of: auto" from the other branch.
InputSize = Annotated[Union[Annotated[Literal["auto"], Tag("auto")], Annotated[tuple[int, int], Tag("size")]],
                      Discriminator(_input_kind)]


class DetectorConfig(StrictModel):
    """The face detector (RetinaFace)."""

    model: str = Field("retinaface_mnet025", min_length=1, description="Detector model name in models/.")
    input_size: InputSize = Field(
        "auto", description="Network input: auto, or [width, height], each a multiple of 32 between 64 and 4096. "
        "auto follows each camera's aspect ratio: long side max_input_side, the other side the nearest multiple "
        "of 32 (1920x1080 and 1280x720 → 640x352, 640x480 → 640x480), and a smaller frame is padded to multiples "
        "of 32, never enlarged (596x336 → 608x352). A fixed size fits every frame into it (a 16:9 frame in 640x480 "
        "leaves a quarter padding). Larger finds smaller faces, slower. backend tensorrt needs a fixed size.")
    max_input_side: int = Field(640, ge=64, le=4096, description="input_size auto only: the long side of the "
                                                                 "detector input, a multiple of 32. Larger finds "
                                                                 "smaller faces, slower.")
    score_threshold: float = Field(0.8, ge=0, le=1, description="Minimum face score to keep a detection.")
    nms_threshold: float = Field(0.4, ge=0, le=1, description="IoU above which overlapping detections are merged.")
    min_face_px: int = Field(32, ge=0, description="Faces narrower than this many pixels (original frame) are "
                                                   "ignored: too small to read an emotion.")
    max_faces: int = Field(16, ge=1, le=256, description="At most this many faces (highest scores) per frame.")
    flip: bool = Field(False, description="Also run the detector on each frame's mirror image and average every "
                       "face with its mirror twin (box, score, five points; a face found once is kept as found). "
                       "The head pose of a photo and of its mirror then agree exactly (without: yaw within 3° for "
                       "75 % of faces/wild, pitch 61 %). Costs a second detector run per detected frame. OpenCV "
                       "frame path only (inference.frame_path: opencv).")
    interval: int = Field(1, ge=1, le=30, description="Run the detector on every Nth frame of a camera (1: every "
                          "frame). The frames between take each tracked face where its track's motion puts it and "
                          "still read its emotion; a face that appears waits for the next detection, and one the last "
                          "detection missed is not reported until found again. Cameras "
                          "detect on different frames (staggered by name). Keep interval / fps well under "
                          "tracking.max_age_s, or tracks end between detections. Both frame paths; "
                          "BENCHMARKS.md 'Detecting every Nth frame' says what it saves and costs.")

    @field_validator("input_size", mode="before")
    @classmethod
    def _check_shape(cls, value: object) -> object:
        """Say `auto or [width, height]` instead of pydantic's union and tuple wording."""
        if value == AUTO:
            return value
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ValueError("must be auto or [width, height], two integers, e.g. [640, 352]")
        return value

    @field_validator("input_size")
    @classmethod
    def _check_strides(cls, value: tuple[int, int] | str) -> tuple[int, int] | str:
        """RetinaFace's feature strides go up to 32, so each side must divide by 32."""
        if isinstance(value, tuple):
            for index, side in enumerate(value):
                _check_side(side, key=(index,))
        return value

    @field_validator("max_input_side")
    @classmethod
    def _check_max_side(cls, value: int) -> int:
        _check_side(value)
        return value

    @property
    def fixed_input_size(self) -> tuple[int, int] | None:
        """The one input size every frame gets, or None with auto (a size per camera shape)."""
        return None if self.input_size == AUTO else (int(self.input_size[0]), int(self.input_size[1]))

    def input_for(self, frame_size: tuple[int, int]) -> tuple[int, int]:
        """The detector input (width, height) for frames of `frame_size` (width, height): the fixed input_size, or
        with auto the one that follows the frame's aspect ratio (vision.retinaface.auto_input_size, cached)."""
        fixed = self.fixed_input_size
        if fixed is not None:
            return fixed
        return auto_input_size((int(frame_size[0]), int(frame_size[1])), self.max_input_side)

    def describe_input(self) -> str:
        """The setting in a few words, for check-config and the tools: `640x480`, or `auto (long side 640)`."""
        fixed = self.fixed_input_size
        return f"{fixed[0]}x{fixed[1]}" if fixed else f"auto (long side {self.max_input_side})"


def _check_side(side: int, key: tuple[int, ...] = ()) -> None:
    if side % 32 or not 64 <= side <= 4096:
        raise ConfigValueError("width and height must each be a multiple of 32 between 64 and 4096" if key else
                               "must be a multiple of 32 between 64 and 4096", key=key, value=side)


FlipFollowed = Literal[True, False, "alternate"]  # emotion.flip_followed (inference.classifier.followed_read)


class EmotionConfig(StrictModel):
    """The emotion classifier run on each face."""

    model: str = Field("dlibface_emotion150", min_length=1, description="Emotion model name in models/: "
                       "dlibface_emotion150 (dlib's face network fine-tuned, 150 px; reads photos best, 5.4 ms per "
                       "face with flip on 2 CPU cores), dlibface_student64 (2.3 ms), mini_xception_fer2013 or "
                       "fer2013_resnet_t64 (models/README.md: what each reads right and costs).")
    crop: Literal["align", "box"] = Field("box", description="How the face is cut for the classifier: box = the "
                                                             "detection box plus box_margin (measured best on "
                                                             "faces/wild, see BENCHMARKS.md), align = 5-point "
                                                             "similarity alignment onto FER2013's framing.")
    box_margin: float = Field(0.0, ge=0, le=1, description="crop=box only: margin added on each side, as a "
                                                            "fraction of the box size.")
    flip: bool = Field(True, description="Test-time flip: classify each face and its mirror image in the same "
                                         "batch and average the two. Twice the classifier work (+0.75 ms per face "
                                         "on 2 CPU cores); more right answers on faces/wild (12 fixed, 4 broken).")
    flip_followed: FlipFollowed = Field(
        "alternate", description="With flip and detector.interval > 1, how the faces of frames without detection are "
        "read (detection frames always read each face and its mirror): true = both ways, as detection frames; "
        "false = once, as they are; alternate = once, as they are and mirrored on alternate frames of the camera, so "
        "each track's smoothing still averages both views. false and alternate do a third less emotion work at "
        "interval 3; alternate agrees with every-frame detection as often as true on one face (BENCHMARKS.md, "
        "'Followed faces read by turns').")


class TritonModelRef(StrictModel):
    """Which model of the Triton server serves one of our models."""

    name: str = Field(..., min_length=1, description="The model's name in the Triton repository (its folder).")
    version: str = Field("", pattern=r"^[0-9]*$", description="Model version to use; empty = the server's "
                                                              "version policy (the latest loaded).")


class TritonSettings(StrictModel):
    """`inference.triton`: the Triton Inference Server (KServe v2 over gRPC) that runs the models (backend triton)."""

    url: str | None = Field(None, description="gRPC address of the server, host:port (e.g. triton.local:8001; "
                                              "grpc:// is accepted and dropped). Required with backend triton.")
    models: dict[str, TritonModelRef] = Field(
        default_factory=dict, description="Our model name (detector.model, emotion.model) → the Triton model that "
        "serves it ({name, version}). A model left out is served under its own name, the latest version: what "
        "`prepare-models --triton-repo` writes.")
    timeout_ms: float = Field(2000.0, gt=0, le=600_000, description="Longest wait for one batch's answer, in "
                                                                     "milliseconds; past it the batch fails.")
    token: SecretStr | None = Field(None, description="Sent as `authorization: Bearer TOKEN` with every request "
                                                      "(a gateway in front of Triton); never shown or logged. Use "
                                                      "${VAR} to keep it out of the file.")
    tls: bool = Field(False, description="Connect with TLS, verifying the server's certificate.")
    ca_file: str | None = Field(None, description="With tls: CA bundle (PEM) that signed the server's "
                                                  "certificate; left out = the system's CAs.")
    reconnect_min_s: float = Field(0.5, gt=0, le=600, description="First wait before checking an unreachable "
                                                                  "server again; doubles after each failure.")
    reconnect_max_s: float = Field(15.0, gt=0, le=3600, description="Longest wait between two checks of an "
                                                                    "unreachable server.")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        """host:port, the form gRPC dials; an http:// address is the HTTP port, a mistake worth naming."""
        if value is None or value == "":
            return None
        address = value.removeprefix("grpc://")
        host, _, port = address.rpartition(":")
        if "://" in address or "/" in address or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be host:port of Triton's gRPC endpoint (8001 by default), e.g. 127.0.0.1:8001")
        return address

    @field_validator("token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: object) -> object:
        """`${TRITON_TOKEN:-}` with the variable unset means no token."""
        return None if value == "" else value

    def model_ref(self, model: str) -> TritonModelRef:
        """The Triton model serving our model `model` (its own name, latest version, when not mapped)."""
        return self.models.get(model) or TritonModelRef(name=model)

    def describe(self) -> str:
        """One line for check-config and logs; the token is never shown."""
        auth = ", token ***" if self.token is not None else ""
        return f"triton {'grpcs' if self.tls else 'grpc'}://{self.url}{auth}, timeout {self.timeout_ms:g} ms"


# A process of at most this many cameras analyses one frame of each at a time when frames_in_flight is auto (0).
SMALL_PROCESS_CAMERAS = 8


class InferenceConfig(StrictModel):
    """Where and how the models run, and how requests from all cameras are batched."""

    backend: Literal["onnxruntime", "tensorrt", "triton"] = Field(
        "onnxruntime", description="Inference library: onnxruntime, tensorrt engines built by build-engine, or "
        "triton: each batch sent to a Triton Inference Server (inference.triton).")
    device: Literal["cpu", "cuda", "tensorrt"] = Field("cpu", description="onnxruntime execution provider: cpu, "
                                                       "cuda, or tensorrt (ORT's TensorRT provider).")
    precision: Literal["fp32", "fp16", "int8"] = Field("fp32", description="Numeric precision of the models.")
    max_batch: int = Field(32, ge=1, le=1024, description="Most faces or frames sent to a model in one batch.")
    max_delay_ms: float = Field(4.0, ge=0, le=1000, description="Longest wait for a batch to fill before it is "
                                                                "run anyway, in milliseconds.")
    lanes: int = Field(1, ge=1, le=16, description="Parallel inference workers (streams) per model.")
    batch_step: int = Field(2, ge=2, le=64, description="device cuda: a batch is padded up to the next power of "
                                                        "this (capped at max_batch), and each padded size has "
                                                        "its own session per lane (ONNX Runtime re-plans for "
                                                        "1-3 s on every new shape; runs of fewer than 4 "
                                                        "frames or 16 faces are padded up to those). 2 wastes "
                                                        "the least compute on padding (1.12x more frames than 4 "
                                                        "at 64 cameras on "
                                                        "an H200); larger takes less GPU memory and start time.")
    face_batch_step: int = Field(4, ge=0, le=64, description="device cuda, frame graphs path: face runs (the "
                                 "emotion network's) are padded to powers of this from 16 faces, each size a "
                                 "session of its own per lane; 0 = batch_step's. 4 (the default) prepares 16, 64 "
                                 "and 256 faces instead of 2's 16, 32, 64, 128 and 256: on an H100 40-60 MB less "
                                 "host memory a camera group, the same frames analysed (BENCHMARKS.md, round 20).")
    frame_path: Literal["auto", "opencv", "graph"] = Field(
        "auto", description="Where a frame's letterbox, the detector's candidate decoding and NMS, and the face "
        "crops run. opencv: on the host, in OpenCV and numpy, around the two models. graph: inside ONNX graphs "
        "built around the models (pipeline/modelprep/frame_graphs.py), on the models' device; on cuda, frames "
        "decoded by NVDEC then never leave the GPU, and only faces and probabilities come back. auto: graph with "
        "backend onnxruntime on device cuda, else opencv.")
    frames_in_flight: int = Field(0, ge=0, le=8, description="Frames of one camera that may be in the shared "
                                  "engine at once. 1: a camera hands over its next frame only when the previous "
                                  "one is analysed, so it analyses at most 1 / (queueing + batch time) frames per "
                                  "second. 2 or more: the next frame joins a batch while the previous one is "
                                  "still running (results still come out in frame order); when the engine is "
                                  "saturated, frames then wait longer (p99 213-239 ms instead of 144-242 ms at "
                                  "64 cameras on an H200, BENCHMARKS.md). 0 = auto: 2 on the frame "
                                  f"graphs path with device cuda in a process of more than {SMALL_PROCESS_CAMERAS} "
                                  f"cameras, else 1 ({SMALL_PROCESS_CAMERAS} cameras keep up with one each, in "
                                  "less GPU memory; the OpenCV path analyses one frame at a time whatever this "
                                  "says).")
    processes: int = Field(1, ge=1, le=64, description="Camera groups, each in a process of its own with its own "
                           "engine (cameras dealt round-robin, in config order). One Python process runs out of "
                           "GIL before a large GPU runs out of work: 64 cameras of 1080p at 25 fps on an H200 "
                           "analysed 47-68 % of their frames as 1 process, 99.9 % as 2 (p99 62 ms, 3.6 cores) and "
                           "all as 4 (p99 22 ms); about 32 cameras per group. On a GPU the processes share it well "
                           "only through NVIDIA's Multi-Process Service (deploy/nvidia-mps.service); without it "
                           "they analysed no more than one process. Each group holds its own copy of the models "
                           "(4.1 GB of GPU memory per 16-camera group on an H200). 1 = everything in the daemon's "
                           "process.")
    devices: list[int] | None = Field(None, description="device cuda with processes > 1: the GPUs the camera "
                                      "groups are spread over, round-robin, each group on one (numbered as CUDA "
                                      "numbers them in this process, i.e. within CUDA_VISIBLE_DEVICES when that is "
                                      "set). Default: every GPU nvidia-smi lists. Run NVIDIA MPS for every GPU "
                                      "used (README, \"Many cameras: what to tune\").")
    threads: int = Field(0, ge=0, le=256, description="CPU threads per session; 0 = the library default.")
    max_faces_per_run: int = Field(0, ge=0, le=65_536, description="Frame graphs path: the most face crops "
                                   "(mirror images included, emotion.flip) the emotion model reads in one run; a "
                                   "batch with more runs in parts. On cuda each padded count up to this has its "
                                   "own session, and the largest sets the memory arena's size. 0 = auto: 8 a frame "
                                   "of a full batch (4 faces, each with its mirror image), at most 256: 256 at "
                                   "max_batch 32 or more, 128 at 16, 64 at 8 (8 cameras' batches: 1,239 MiB of an "
                                   "H200 in all; at max_batch 16, 1,517 MiB with 128 against 2,063 with 256; "
                                   "BENCHMARKS.md, bench memory).")
    max_frames_per_run: int = Field(16, ge=1, le=1024, description="Frame graphs path: the most frames a lane "
                                    "holds and the detector reads in one run; a larger batch runs in parts of this "
                                    "many (its frames to detect on first). On cuda each padded count up to this has "
                                    "its own session, the largest run sets the detector's share of the memory arena "
                                    "(a run of 64 1080p frames holds them once as float16, 0.8 GB, before its first "
                                    "halving), and each lane's frame buffer has this many rows (6.2 MB each at "
                                    "1080p; BENCHMARKS.md, bench memory).")
    cudnn_max_workspace: bool = Field(True, description="device cuda: let cuDNN choose convolution algorithms "
                                      "that need the largest scratch memory (ONNX Runtime's "
                                      "cudnn_conv_use_max_workspace, its default). false: less GPU memory per "
                                      "session, possibly slower convolutions (bench memory measures both).")
    cublas_workspace: str = Field(":16:8", pattern=r"^(:[0-9]+:[0-9]+)*$", description="device cuda: cuBLAS's "
                                  "scratch memory per handle, as its CUBLAS_WORKSPACE_CONFIG (:KiB:count, pairs "
                                  "repeatable; \"\" = cuBLAS's own default). ONNX Runtime makes a cuBLAS handle per "
                                  "CUDA session, a camera group has 16 sessions, and on an H200 cuBLAS's default "
                                  "took ~128 MB each: 147 MB per further session against 19 MB with :16:8, at the "
                                  "same speed (BENCHMARKS.md). The variable, when set in the daemon's environment, "
                                  "wins.")
    memory_pattern: bool = Field(False, description="device cuda: ONNX Runtime's memory pattern (plans a run's "
                                 "activations and reserves them in one block per input shape, kept besides the "
                                 "shared arena). Off by default: on an H200 it cost 250 MiB at 8 cameras, 240 at "
                                 "64 (2 groups) and 820 at 150 (5 groups) for the same frames analysed "
                                 "(BENCHMARKS.md); true: ONNX Runtime's own default, runs a little faster alone.")
    cuda_graphs: bool = Field(False, description="device cuda, frame graphs path: replay each prepared run size "
                              "of the frame graphs as a CUDA graph (ONNX Runtime's enable_cuda_graph): one launch "
                              "instead of one per node, which is most of a lane's CPU. The detector is captured "
                              "without its NonMaxSuppression (run as before), and every captured size keeps its "
                              "own input and output buffers and its own memory arena on the GPU (outside "
                              "gpu_memory_limit_mb). On an H100's host at 150 cameras (5 groups): 6.2-7.1 CPU "
                              "cores instead of 7.8-8.4, the same frames and latency, 2 GB more GPU memory "
                              "(~0.4 GB a group; BENCHMARKS.md, round 16). Off by default for that memory; turn "
                              "it on where the host's cores are the limit (check-config advises it past 96 "
                              "cameras a GPU).")
    gpu_wait: Literal["block", "spin", "auto"] = Field("block", description="device cuda or tensorrt: how a "
                                                      "thread waits for the GPU inside ONNX Runtime, TensorRT and "
                                                      "NVDEC (results copied back, a decoded frame mapped). block: "
                                                      "it sleeps until the GPU is done; spin: it busy-waits, a "
                                                      "core each while the GPU works (microseconds sooner); auto: "
                                                      "CUDA's own choice, which spins whenever the machine has "
                                                      "more cores than CUDA contexts. Set on every GPU's primary "
                                                      "context before the models load (BENCHMARKS.md, round 9).")
    gpu_stack_bytes: int | None = Field(0, ge=0, le=131_072, description="device cuda or tensorrt: the stack "
                                        "per GPU thread that the process's CUDA context reserves local memory "
                                        "for, times every thread the GPU holds at once (264 MiB on an H200 at "
                                        "CUDA's 1,024 bytes). CUDA grows it by itself for any kernel that needs "
                                        "more, so 0 (the default) leaves what the models' kernels need: 264 MiB "
                                        "less per process once the models ran, the same frames analysed (an "
                                        "H200: 8 cameras 150 MiB less, 150 cameras in 5 groups 824 MiB less; "
                                        "BENCHMARKS.md). null = CUDA's default.")
    gpu_memory_limit_mb: int = Field(0, ge=0, le=1_048_576, description="device cuda: the most memory ONNX "
                                     "Runtime's shared CUDA arena (every session of the process) may hold, in MB; "
                                     "0 = no cap. A run that needs more fails its batch (logged) instead of "
                                     "taking more: size it with bench memory, with headroom.")
    trim_heap_s: float = Field(30.0, ge=0, le=86_400, description="Seconds between giving the freed heap back "
                               "to the system (glibc's malloc_trim) in the daemon and in each camera group; 0 = "
                               "never. glibc keeps what a process frees resident unless asked: a CPU daemon of 4 "
                               "cameras gives back 33-35 MB (11 %), a GPU camera group ~7 MB (BENCHMARKS.md, "
                               "round 20). The first trim comes one period after start; each takes milliseconds.")
    queue_size: int = Field(256, ge=1, le=100_000, description="Requests that may wait for inference, per model. "
                                                               "When the queue is full a new request is refused "
                                                               "at once and the camera skips that frame (counted "
                                                               "in emotion_camera_busy_skips_total); queued "
                                                               "requests are never dropped.")
    tensorrt: TensorRTSettings = Field(default_factory=TensorRTSettings, description="backend tensorrt only: how "
                                       "its engines are obtained (built at start when missing, or refused with the "
                                       "build-engine command).")
    triton: TritonSettings = Field(default_factory=TritonSettings, description="backend triton only: the server, "
                                   "the model names it serves ours under, timeout, token and TLS.")

    @property
    def graph_frames(self) -> bool:
        """Whether frames go through the frame graphs (frame_path, with auto resolved)."""
        if self.frame_path == "auto":
            return self.backend == "onnxruntime" and self.device == "cuda"
        return self.frame_path == "graph"

    @property
    def face_step(self) -> int:
        """face_batch_step with 0 resolved to batch_step's."""
        return self.face_batch_step or self.batch_step

    @property
    def faces_per_run(self) -> int:
        """max_faces_per_run with auto (0) resolved for this max_batch."""
        return self.max_faces_per_run or min(AUTO_FACES_MOST, AUTO_FACES_PER_FRAME * self.max_batch)

    def for_cameras(self, cameras: int) -> InferenceConfig:
        """These settings for a process that analyses `cameras` cameras. On the frame graphs path a batch holds at
        most one frame per camera per frame in flight, so 8 cameras with 2 in flight never run more than 16:
        max_batch is capped there (never raised), and no larger padded size (on a GPU a session of its own, with
        its memory and start-up time) is prepared. frames_in_flight auto is 1 for at most SMALL_PROCESS_CAMERAS
        cameras on a GPU: they keep up with one each (8 cameras of 1080p on an H200: every frame either way, p99
        23 against 21 ms) in 0.25 GB less GPU memory (BENCHMARKS.md). The OpenCV path batches faces too, and is
        left alone."""
        if not self.graph_frames:
            return self
        update: dict[str, int] = {}
        in_flight = self.frames_in_flight_for(True, cameras)
        if in_flight != self.frames_in_flight_for(True):  # auto, resolved for these cameras: kept in the copy
            update["frames_in_flight"] = in_flight
        most = max(1, cameras) * in_flight
        if most < self.max_batch:
            update["max_batch"] = most
        return self.model_copy(update=update) if update else self

    def frames_in_flight_for(self, graph: bool, cameras: int | None = None) -> int:
        """frames_in_flight with auto resolved, for the frame graphs path (`graph`) or the OpenCV path (always 1:
        it analyses a frame on the camera's thread before taking the next); auto is 2 on cuda, but 1 in a process
        of `cameras` <= SMALL_PROCESS_CAMERAS (for_cameras keeps that in its copy)."""
        if not graph:
            return 1
        if self.frames_in_flight == 0:
            few = cameras is not None and cameras <= SMALL_PROCESS_CAMERAS
            return 2 if self.device == "cuda" and not few else 1
        return self.frames_in_flight

    @field_validator("face_batch_step")
    @classmethod
    def _check_face_step(cls, value: int) -> int:
        """Powers of 1 never grow: a step is 2 or more, or 0 for batch_step's."""
        if value == 1:
            raise ValueError("must be 0 (batch_step's) or at least 2")
        return value

    @model_validator(mode="after")
    def _triton_needs_url(self) -> InferenceConfig:
        """The server's address cannot be guessed; a frame graph runs in-process, so it cannot go to Triton."""
        if self.backend != "triton":
            return self
        if self.triton.url is None:
            raise ConfigValueError("backend triton needs the server's gRPC address: set inference.triton.url "
                                   "(host:port, e.g. 127.0.0.1:8001)", key="triton", value=MISSING)
        if self.frame_path == "graph":
            raise ConfigValueError("frame_path graph is not supported with backend triton (the frame graphs run "
                                   "in-process): set frame_path opencv or auto", key="frame_path",
                                   value=self.frame_path)
        return self

    @model_validator(mode="after")
    def _cuda_graphs_need_the_gpu_frame_path(self) -> InferenceConfig:
        """Capture is a property of the CUDA frame lanes: anywhere else the key would silently do nothing."""
        if self.cuda_graphs and (self.device != "cuda" or not self.graph_frames):
            raise ConfigValueError("cuda_graphs replays the frame graphs on a GPU: it needs backend onnxruntime, "
                                   "device cuda and frame_path graph or auto", key="cuda_graphs",
                                   value=self.cuda_graphs)
        return self

    @model_validator(mode="after")
    def _frame_graphs_need_onnxruntime(self) -> InferenceConfig:
        if self.frame_path == "graph" and (self.backend != "onnxruntime" or self.device == "tensorrt"):
            raise ConfigValueError("frame_path graph runs through ONNX Runtime on cpu or cuda: set backend "
                                   "onnxruntime and device cpu or cuda, or frame_path opencv",
                                   key="frame_path", value=self.frame_path)
        return self

    @field_validator("devices")
    @classmethod
    def _devices_are_distinct_ordinals(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("give at least one GPU number, e.g. [0, 1], or leave devices out for every GPU")
        if min(value) < 0 or len(set(value)) != len(value):
            raise ValueError(f"GPU numbers must be distinct and 0 or more, got {value}")
        return value

    @model_validator(mode="after")
    def _backend_needs_gpu(self) -> InferenceConfig:
        """TensorRT engines cannot run on the CPU; catch it here rather than at engine load."""
        if self.backend == "tensorrt" and self.device == "cpu":
            raise ConfigValueError("backend tensorrt runs on the GPU: set inference.device to cuda",
                                   key="device", value=self.device)
        return self
