"""Issue 26 item 8 (a): a camera URL with its secret in the FIRST path segment, as some DVRs take the login
(`rtsp://host:554/password=x&user=admin`), is masked everywhere the URL is shown.

The existing tests only had such a secret after an `&` (`/user=admin&password=…`), so a masking rule that forgot
`/` as the character before a `name=value` pair passed them all, and `/password=…` showed in clear. Here the URL
goes through each place that shows one: `mask_secrets` itself, check-config's summary (also logged at start-up),
the capture's connection error (which becomes the camera event's detail and the status page's last failure), the
camera event sent to every output, and the log lines of both log formats, tracebacks included.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.capture.source_base import SourceError
from pipeline.capture.sources import open_source
from pipeline.config.app import CameraConfig, parse_config, summarize
from pipeline.core.redact import mask_secrets
from pipeline.core.types import CameraEvent
from pipeline.outputs.events import camera_event
from tests.conftest import ROOT
from tests.running_daemon import free_port

# URL as written → as it must be shown. The secrets are distinctive, so a leak anywhere is found by search.
DVR_URLS = {
    "rtsp://host:554/password=x&user=admin": "rtsp://host:554/password=***&user=admin",
    "rtsp://10.0.0.5/user=admin&password=hunter2&channel=1&stream=0.sdp":
        "rtsp://10.0.0.5/user=admin&password=***&channel=1&stream=0.sdp",
    "rtsp://10.0.0.5:554/password=Dvr-Secret-1&user=admin&channel=1":
        "rtsp://10.0.0.5:554/password=***&user=admin&channel=1",
    "rtsp://10.0.0.5/pwd=Dvr-Secret-2&user=admin": "rtsp://10.0.0.5/pwd=***&user=admin",
    "rtsp://10.0.0.5:554/cam/realmonitor/PassWord=Dvr-Secret-3&user=admin":
        "rtsp://10.0.0.5:554/cam/realmonitor/PassWord=***&user=admin",
    "http://10.0.0.5:8080/token=Dvr-Secret-4": "http://10.0.0.5:8080/token=***",
    "rtsp://admin:Dvr-Secret-5@10.0.0.5/password=Dvr-Secret-6&channel=1":
        "rtsp://admin:***@10.0.0.5/password=***&channel=1",
}
SECRETS = ("password=x", "hunter2", *(f"Dvr-Secret-{n}" for n in range(1, 7)))


def leaked(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


@pytest.mark.parametrize("url", DVR_URLS)
def test_mask_secrets_masks_a_secret_in_the_first_path_segment(url: str) -> None:
    assert mask_secrets(url) == DVR_URLS[url]
    said = f"cannot connect to {url} (host down); retrying"  # a value runs to `&` or whitespace
    assert mask_secrets(said) == f"cannot connect to {DVR_URLS[url]} (host down); retrying"
    assert mask_secrets(DVR_URLS[url]) == DVR_URLS[url]  # masking a masked text changes nothing


def test_check_config_summary_shows_dvr_urls_masked() -> None:
    cameras = "".join(f"  - {{name: cam{i}, source: '{url}'}}\n" for i, url in enumerate(DVR_URLS))
    shown = summarize(parse_config(f"cameras:\n{cameras}", "cfg.yaml", env={}))
    for i, url in enumerate(DVR_URLS):
        kind = url.split("://", 1)[0]
        assert f"cam{i}: {DVR_URLS[url]} ({kind})" in shown, shown
    assert leaked(shown) == []


def test_connection_error_and_camera_event_show_the_url_masked() -> None:
    """The capture's error when the DVR cannot be reached: it is logged, sent as the camera event's detail and
    kept as the status page's last failure."""
    port = free_port()  # nothing listens there: the connection is refused at once
    url = f"rtsp://127.0.0.1:{port}/password=Dvr-Secret-1&user=admin&channel=1"
    with pytest.raises(SourceError) as caught:
        open_source(CameraConfig(name="dvr", decode="cpu", source=url))
    message = str(caught.value)
    assert f"rtsp://127.0.0.1:{port}/password=***&user=admin&channel=1" in message and leaked(message) == []
    event = camera_event(CameraEvent("dvr", 0.0, "reconnecting", f"cannot connect to {url}"))
    assert event["detail"] == f"cannot connect to rtsp://127.0.0.1:{port}/password=***&user=admin&channel=1"


LOG_SCRIPT = """
import logging, sys
from pipeline.service.logs import setup_logging
setup_logging("info", sys.argv[1])
log = logging.getLogger("pipeline.capture")
for url in sys.argv[2:]:
    log.info("camera dvr: opening %s", url)
    try:
        raise ConnectionError(f"cannot connect to {url}")
    except ConnectionError:
        log.exception("camera dvr: failed")
"""


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_log_lines_and_tracebacks_show_dvr_urls_masked(fmt: str) -> None:
    done = subprocess.run([sys.executable, "-c", LOG_SCRIPT, fmt, *DVR_URLS], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    logged = done.stdout + done.stderr
    assert logged.count("camera dvr: opening") == len(DVR_URLS), logged
    assert leaked(logged) == [], logged
    for masked in DVR_URLS.values():
        assert masked in logged, (masked, logged)
