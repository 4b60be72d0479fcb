"""Capture: getting frames out of cameras: sources (demo, files, USB, RTSP, HTTP/MJPEG), the capture thread with its lifecycle, reconnect backoff and stall watch, and per-camera rates.

Owns: capture.sources, capture.thread, capture.stats, capture.settings (the cameras: section). May import: core."""
