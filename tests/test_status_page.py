"""The status page in a real headless Chromium (Debian's chromium + chromium-driver, driven by selenium).

`.ci/run` installs both; without them the test is skipped with the reason (and CI, with EMOTION_STRICT_SKIPS=1, fails
on that skip). The daemon serves two looping file cameras with a token; the page is opened as an operator would, with
`?token=` in its address. Nothing is timed: each check waits for what the page shows, with time-outs for hangs only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.running_daemon import (
    RunningDaemon,
    clip,
    free_port,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TOKEN = "page-t0ken"


def _texts(browser, selector: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The text of every element `selector` matches, read in one script call: the history table re-renders as
    events arrive, so rows found by one WebDriver call can be gone (stale) by the next that reads them."""
    script = "return Array.from(document.querySelectorAll(arguments[0]), element => element.textContent);"
    return list(browser.execute_script(script, selector))


def _browser(profile: Path):  # type: ignore[no-untyped-def]
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip(f"needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (requirements-dev.txt)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
                f"--user-data-dir={profile}", "--window-size=1100,820"):
        options.add_argument(arg)
    options.page_load_strategy = "eager"
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    driver = _browser(tmp_path / "profile")
    try:
        yield driver
    finally:
        driver.quit()


def test_status_page_shows_live_tiles(prepared_models: None, tmp_path: Path,
                                      browser) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    port = free_port()
    config = write_config(tmp_path / "config.yaml",
                          [f"{{name: lobby, source: '{clip()}', fps: 10, loop: true}}",
                           f"{{name: hall, source: '{clip()}', fps: 5, loop: true}}"],
                          port=port, server=f"token: {TOKEN}, preview_fps: 4")
    daemon = RunningDaemon(config)
    try:
        import urllib.request

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        daemon.wait_for(healthy, 60, "/healthz 200 with both cameras streaming")
        browser.get(f"http://127.0.0.1:{port}/?token={TOKEN}")

        def tiles() -> list:  # type: ignore[type-arg]
            return browser.find_elements(By.CSS_SELECTOR, "#tiles .tile")

        assert wait_until(lambda: len(tiles()) == 2, 30), browser.page_source[:2000]
        assert sorted(t.get_attribute("data-camera") for t in tiles()) == ["hall", "lobby"]
        lobby = browser.find_element(By.CSS_SELECTOR, '.tile[data-camera="lobby"]')

        def preview_src() -> str:
            images = lobby.find_elements(By.CSS_SELECTOR, "img.preview")
            return images[0].get_attribute("src") or "" if images else ""

        def preview_loaded() -> bool:
            return bool(browser.execute_script(
                "const i = document.querySelector('.tile[data-camera=\"lobby\"] img.preview');"
                "return i && i.complete && i.naturalWidth > 0;"))

        assert wait_until(lambda: preview_src().startswith("blob:"), 30), "no preview image arrived"
        assert wait_until(preview_loaded, 30), "the preview image never loaded"
        # The state comes from /api/status, polled once a second: the first preview can arrive before the next poll.
        assert wait_until(lambda: "streaming" in lobby.find_element(By.CSS_SELECTOR, ".state").text, 30), \
            lobby.find_element(By.CSS_SELECTOR, ".state").text
        assert "fps" in lobby.find_element(By.CSS_SELECTOR, ".figures").text
        first_src, first_shot = preview_src(), lobby.find_element(By.CSS_SELECTOR, ".frame").screenshot_as_png

        def preview_changed() -> bool:  # a new image (preview_fps 4), loaded, that looks different from the first
            return preview_src() not in (first_src, "") and preview_loaded() and \
                lobby.find_element(By.CSS_SELECTOR, ".frame").screenshot_as_png != first_shot

        assert wait_until(preview_changed, 30, interval=0.25), "the preview image did not change: a frozen preview"
        def help_text() -> str:
            """The help table's rendered text, its section opened by a click on its summary. Clicked again while
            still closed: a click can land where the summary was before the tiles above it grew (a busy machine)."""
            if browser.find_element(By.CSS_SELECTOR, "#help-section details").get_attribute("open") is None:
                browser.find_element(By.CSS_SELECTOR, "#help-section summary").click()
            return str(browser.find_element(By.CSS_SELECTOR, "#help-section table").text)

        words = ("excellent", "fair", "poor", "unusable", "reconnecting", "disabled")
        assert wait_until(lambda: all(word in help_text() for word in words), 10), help_text()
        assert wait_until(lambda: browser.find_element(By.ID, "overall").text == "ok", 30), \
            browser.find_element(By.ID, "problems").text
        assert re.search(r"memory: daemon \d+\.\d\d GiB", browser.find_element(By.ID, "summary").text), \
            browser.find_element(By.ID, "summary").text  # each process's host memory (one process here)
        assert wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#commands tbody tr"), 60), \
            "no recent command on the page"

        def lobby_visitors() -> list[str]:
            from selenium.common.exceptions import StaleElementReferenceException

            try:  # the table is redrawn every second: a row found may be replaced before it is read
                rows = browser.find_elements(By.CSS_SELECTOR, '#visitors tbody tr[data-camera="lobby"]')
                return [cell.text for cell in rows[0].find_elements(By.TAG_NAME, "td")] if rows else []
            except StaleElementReferenceException:
                return []

        def visitor_seen_and_looked_at() -> bool:  # one reading of the row, checked whole
            row = lobby_visitors()
            return len(row) == 4 and int(row[1]) >= 1 and row[3].endswith("%")
        # the clip's face is a visitor once tracked for arrive_frames; the share of time looked at follows its pose
        assert wait_until(visitor_seen_and_looked_at, 30), lobby_visitors()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            metrics = response.read().decode()
        assert 'emotion_visitors_total{camera="lobby"}' in metrics
        assert "# TYPE emotion_looked_at_seconds_total counter" in metrics
        target = os.environ.get("STATUS_PAGE_SCREENSHOT")  # docs/status-page.png is made this way
        if target:
            browser.save_screenshot(target)
        code, _ = daemon.terminate()
        assert code == 0
    finally:
        daemon.kill()



def test_config_is_edited_checked_and_applied_from_the_page(prepared_models: None, tmp_path: Path,
                                                             browser) -> None:  # type: ignore[no-untyped-def]
    """Issue 26: an edit with a mistake is refused with the error shown at its line and nothing written; a good edit
    is saved (the old file kept as .bak), applied, and the page says so. A disabled camera shows as a grey tile whose
    switch turns it on through the same save (the file's comments kept)."""
    from selenium.webdriver.common.by import By

    port = free_port()
    config = write_config(tmp_path / "config.yaml", [f"{{name: lobby, source: '{clip()}', fps: 5, loop: true}}",
                                                     f"{{name: hall, source: '{clip()}', fps: 4, loop: true, "
                                                     f"enabled: false}}  # the side door"],
                          port=port, server=f"token: {TOKEN}, preview_fps: 1")
    original = config.read_text()
    daemon = RunningDaemon(config)
    try:
        daemon.wait_for(lambda: "status server on" in daemon.stderr_text(), 60, "the status server")
        browser.get(f"http://127.0.0.1:{port}/?token={TOKEN}")
        assert wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#tiles .tile"), 30)
        browser.find_element(By.CSS_SELECTOR, "#config-details summary").click()
        editor = browser.find_element(By.ID, "config-text")
        assert wait_until(lambda: editor.get_attribute("value") == original, 30), editor.get_attribute("value")

        def edit(text: str) -> None:
            browser.execute_script("const e = document.getElementById('config-text'); e.value = arguments[0];"
                                   "e.dispatchEvent(new Event('input'));", text)

        def outcome() -> str:
            return str(browser.find_element(By.ID, "config-outcome").text)

        edit(original.replace("fps: 5", "fps: -5"))
        browser.find_element(By.ID, "config-save").click()
        assert wait_until(lambda: "nothing saved" in outcome(), 30), outcome()
        errors = browser.find_elements(By.CSS_SELECTOR, "#config-errors li")
        assert errors and f"{config}:2: cameras[0].fps" in errors[0].text, [e.text for e in errors]
        assert browser.find_elements(By.CSS_SELECTOR, "#config-lines .bad")  # the line is marked
        assert config.read_text() == original

        edit(original.replace("fps: 5", "fps: 6"))
        browser.find_element(By.ID, "config-save").click()
        assert wait_until(lambda: "reload applied" in outcome(), 60), outcome()
        assert config.read_text() == original.replace("fps: 5", "fps: 6")
        assert (tmp_path / "config.yaml.bak").read_text() == original
        assert wait_until(lambda: "Configuration applied" in browser.find_element(By.ID, "reload").text, 30)
        assert wait_until(lambda: any("applied" in text for text in
                                      _texts(browser, '#history tbody tr[data-type="config"]')),
                          30), browser.find_element(By.ID, "history").text

        hall = browser.find_element(By.CSS_SELECTOR, '.tile[data-camera="hall"]')
        assert "disabled" in hall.get_attribute("class") and hall.find_element(By.CSS_SELECTOR, ".state").text == \
            "disabled"
        hall.find_element(By.CSS_SELECTOR, "input.switch").click()
        assert wait_until(lambda: "streaming" in hall.find_element(By.CSS_SELECTOR, ".state").text, 60), \
            hall.find_element(By.CSS_SELECTOR, ".state").text
        assert "disabled" not in hall.get_attribute("class")
        text = config.read_text()
        assert "enabled: true" in text and "# the side door" in text and "fps: 6" in text, text

        card = browser.find_element(By.CSS_SELECTOR, '.avatar[data-stream="lobby"]')
        from selenium.webdriver.support.ui import Select

        Select(card.find_element(By.TAG_NAME, "select")).select_by_value("sad")
        card.find_element(By.CSS_SELECTOR, "button.send-trial").click()
        assert wait_until(lambda: card.find_element(By.CSS_SELECTOR, ".outcome").text.startswith("sent sad"), 30), \
            card.find_element(By.CSS_SELECTOR, ".outcome").text
        # what the stream was last told (the test, unless the camera's own faces spoke since)
        assert wait_until(lambda: ":" in card.find_element(By.CSS_SELECTOR, ".state").text, 30)
        assert wait_until(lambda: any(e["reason"] == "test" and e["emotion"] == "sad" for e in daemon.of("command")),
                          10)
        code, _ = daemon.terminate()
        assert code == 0
    finally:
        daemon.kill()
