"""The `detector:`, `emotion:` and `inference:` sections: which models run, how, where, and how they are batched.

Owned by the inference wing (Perception and the backends read them); the configuration file composes them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipeline.core.settings import ConfigValueError, StrictModel
from pipeline.inference.gpu.tensorrt import TensorRTSettings


class DetectorConfig(StrictModel):
    """The face detector (RetinaFace)."""

    model: str = Field("retinaface_mnet025", min_length=1, description="Detector model name in models/.")
    input_size: tuple[int, int] = Field((640, 480), description="Network input [width, height]; each a multiple "
                                                                "of 32 between 64 and 4096. Larger finds smaller "
                                                                "faces, slower.")
    score_threshold: float = Field(0.8, ge=0, le=1, description="Minimum face score to keep a detection.")
    nms_threshold: float = Field(0.4, ge=0, le=1, description="IoU above which overlapping detections are merged.")
    min_face_px: int = Field(32, ge=0, description="Faces narrower than this many pixels (original frame) are "
                                                   "ignored: too small to read an emotion.")
    max_faces: int = Field(16, ge=1, le=256, description="At most this many faces (highest scores) per frame.")

    @field_validator("input_size", mode="before")
    @classmethod
    def _check_shape(cls, value: object) -> object:
        """Say `[width, height]` instead of pydantic's tuple wording."""
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ValueError("must be [width, height], two integers, e.g. [640, 480]")
        return value

    @field_validator("input_size")
    @classmethod
    def _check_strides(cls, value: tuple[int, int]) -> tuple[int, int]:
        """RetinaFace's feature strides go up to 32, so each side must divide by 32."""
        for index, side in enumerate(value):
            if side % 32 or not 64 <= side <= 4096:
                raise ConfigValueError("width and height must each be a multiple of 32 between 64 and 4096",
                                       key=(index,), value=side)
        return value


class EmotionConfig(StrictModel):
    """The emotion classifier run on each face."""

    model: str = Field("mini_xception_fer2013", min_length=1, description="Emotion model name in models/.")
    crop: Literal["align", "box"] = Field("box", description="How the face is cut for the classifier: box = the "
                                                             "detection box plus box_margin (measured best on "
                                                             "faces/wild, see BENCHMARKS.md), align = 5-point "
                                                             "similarity alignment onto FER2013's framing.")
    box_margin: float = Field(0.0, ge=0, le=1, description="crop=box only: margin added on each side, as a "
                                                            "fraction of the box size.")


class InferenceConfig(StrictModel):
    """Where and how the models run, and how requests from all cameras are batched."""

    backend: Literal["onnxruntime", "tensorrt"] = Field("onnxruntime", description="Inference library: "
                                                        "onnxruntime, or tensorrt engines built by build-engine.")
    device: Literal["cpu", "cuda", "tensorrt"] = Field("cpu", description="onnxruntime execution provider: cpu, "
                                                       "cuda, or tensorrt (ORT's TensorRT provider).")
    precision: Literal["fp32", "fp16", "int8"] = Field("fp32", description="Numeric precision of the models.")
    max_batch: int = Field(32, ge=1, le=1024, description="Most faces or frames sent to a model in one batch.")
    max_delay_ms: float = Field(4.0, ge=0, le=1000, description="Longest wait for a batch to fill before it is "
                                                                "run anyway, in milliseconds.")
    lanes: int = Field(1, ge=1, le=16, description="Parallel inference workers (streams) per model.")
    batch_step: int = Field(4, ge=2, le=64, description="device cuda: a batch is padded up to the next power of "
                                                        "this (capped at max_batch), and each padded size has "
                                                        "its own session per lane (ONNX Runtime re-plans for "
                                                        "1-3 s on every new shape). Smaller wastes less compute "
                                                        "on padding and takes more GPU memory.")
    frame_path: Literal["auto", "opencv", "graph"] = Field(
        "auto", description="Where a frame's letterbox, the detector's candidate decoding and NMS, and the face "
        "crops run. opencv: on the host, in OpenCV and numpy, around the two models. graph: inside ONNX graphs "
        "built around the models (pipeline/modelprep/frame_graphs.py), on the models' device; on cuda, frames "
        "decoded by NVDEC then never leave the GPU, and only faces and probabilities come back. auto: graph with "
        "backend onnxruntime on device cuda, else opencv.")
    threads: int = Field(0, ge=0, le=256, description="CPU threads per session; 0 = the library default.")
    queue_size: int = Field(256, ge=1, le=100_000, description="Requests that may wait for inference, per model. "
                                                               "When the queue is full a new request is refused "
                                                               "at once and the camera skips that frame (counted "
                                                               "in emotion_camera_busy_skips_total); queued "
                                                               "requests are never dropped.")
    tensorrt: TensorRTSettings = Field(default_factory=TensorRTSettings, description="backend tensorrt only: how "
                                       "its engines are obtained (built at start when missing, or refused with the "
                                       "build-engine command).")

    @property
    def graph_frames(self) -> bool:
        """Whether frames go through the frame graphs (frame_path, with auto resolved)."""
        if self.frame_path == "auto":
            return self.backend == "onnxruntime" and self.device == "cuda"
        return self.frame_path == "graph"

    @model_validator(mode="after")
    def _frame_graphs_need_onnxruntime(self) -> InferenceConfig:
        if self.frame_path == "graph" and (self.backend != "onnxruntime" or self.device == "tensorrt"):
            raise ConfigValueError("frame_path graph runs through ONNX Runtime on cpu or cuda: set backend "
                                   "onnxruntime and device cpu or cuda, or frame_path opencv",
                                   key="frame_path", value=self.frame_path)
        return self

    @model_validator(mode="after")
    def _backend_needs_gpu(self) -> InferenceConfig:
        """TensorRT engines cannot run on the CPU; catch it here rather than at engine load."""
        if self.backend == "tensorrt" and self.device == "cpu":
            raise ConfigValueError("backend tensorrt runs on the GPU: set inference.device to cuda",
                                   key="device", value=self.device)
        return self
