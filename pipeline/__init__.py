"""Real-time multi-camera facial emotion pipeline: cameras → RetinaFace → emotion → behaviour → avatar commands."""

__version__ = "0.1.0"
