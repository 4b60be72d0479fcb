"""Vision: pure image work on one frame at a time: letterbox, RetinaFace candidate decoding and NMS, face crops and five-point alignment, IoU tracking with emotion smoothing.

Owns: vision.retinaface, vision.align, vision.faces, vision.track. May import: core. No batching, no threads, no models."""
