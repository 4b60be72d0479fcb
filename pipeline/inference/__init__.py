"""Inference: running the shared models: the Backend role and its registry, the ONNX Runtime backend, the dynamic batcher (BatchedModel), and Perception (one detector and one classifier for every camera). GPU-only code lives in inference.gpu.

Owns: inference.backend, inference.onnxruntime, inference.batching, inference.detector, inference.classifier, inference.perception, inference.frames (the frame graphs path: whole frames in, faces and emotions out), inference.settings (the detector:, emotion: and inference: sections). May import: modelprep, vision, core."""
