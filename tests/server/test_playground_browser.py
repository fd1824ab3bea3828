"""The playground page in a real headless Chromium (Selenium): plain and speculative decoding side by side.

Skipped where Selenium or a Chromium + chromedriver pair is not installed (CI installs neither; on Debian:
`apt-get install chromium chromium-driver`, `pip install selenium`). The screenshot goes to tests/artifacts/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def _browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    chrome = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    driver_path = shutil.which("chromedriver")
    if chrome is None or driver_path is None:
        pytest.skip("no Chromium + chromedriver on this machine")
    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,900"):
        options.add_argument(arg)
    try:
        return webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    except Exception as err:  # noqa: BLE001 - a browser that cannot start here is a skip, not a failure
        pytest.skip(f"Chromium did not start: {err}")


def test_playground_streams_plain_and_speculative_side_by_side(server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = _browser()
    try:
        browser.get(server + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: "γ = 4" in b.find_element(By.ID, "spec-title").text)
        max_tokens = browser.find_element(By.ID, "max-tokens")
        max_tokens.clear()
        max_tokens.send_keys("48")
        browser.find_element(By.ID, "run").click()
        done = lambda b: all(b.find_element(By.ID, f"{k}-output").get_attribute("data-done") == "1"  # noqa: E731
                             for k in ("plain", "spec"))
        wait.until(done)
        text = "return Array.from(document.querySelectorAll(arguments[0] + ' span:not(.rejected)'))" \
               ".map(s => s.textContent).join('')"
        plain, spec = browser.execute_script(text, "#plain-output"), browser.execute_script(text, "#spec-output")
        assert plain == spec and len(plain) > len(browser.find_element(By.ID, "prompt").get_attribute("value"))
        accepted = browser.find_elements(By.CSS_SELECTOR, "#spec-output .accepted")
        assert accepted, "no accepted draft was coloured"
        assert not browser.find_elements(By.CSS_SELECTOR, "#plain-output .accepted")
        stats = browser.find_element(By.ID, "spec-stats").text
        assert "α" in stats and "τ" in stats and "tokens/s" in stats
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "playground.png"))
    finally:
        browser.quit()
