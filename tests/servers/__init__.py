"""Real camera-protocol servers (RTSP via GStreamer, HTTP MJPEG via http.server) for camera robustness tests."""
