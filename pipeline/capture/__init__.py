"""Capture: getting frames out of cameras: sources (demo, files, USB, RTSP, HTTP/MJPEG), the capture thread with its lifecycle, reconnect backoff and stall watch, and per-camera rates.

Owns: capture.source_base (the VideoSource role), capture.sources (CPU sources and open_source), capture.nvdec (decoding on the GPU's NVDEC), capture.nv12 (NVDEC's NV12 frames to RGB on the GPU, our kernel), capture.thread, capture.stats, capture.settings (the cameras: section). May import: core."""
