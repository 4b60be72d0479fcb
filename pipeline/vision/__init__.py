"""Vision: pure image work on one frame at a time: letterbox, RetinaFace candidate decoding and NMS, face crops and five-point alignment, IoU tracking with emotion smoothing, following a face between detections, head pose from the five landmarks.

Owns: vision.retinaface, vision.align, vision.faces, vision.track, vision.follow, vision.head_pose. May import: core. No batching, no threads, no models."""
