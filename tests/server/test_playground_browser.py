"""The playground page in a real headless Chromium (Selenium): plain decoding, then speculative decoding, each
timed alone, the measured speedup shown; rejections as hover tooltips (never text inside the output); a chat tab
over the chat template. At temperature 0 the two texts must be shown identical.

Skipped where Selenium or a Chromium + chromedriver pair is not installed (on Debian: `apt-get install chromium
chromium-driver`; selenium is a test extra). The screenshots go to tests/artifacts/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,900")


@pytest.fixture
def browser(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    chrome = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    driver_path = shutil.which("chromedriver")
    if chrome is None or driver_path is None:
        pytest.skip("no Chromium + chromedriver on this machine")
    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for arg in (*FLAGS, f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    try:
        driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    except Exception as err:  # noqa: BLE001 - a browser that cannot start here is a skip, not a failure
        pytest.skip(f"Chromium did not start: {err}")
    try:
        yield driver
    finally:
        driver.quit()


def _run(browser, max_tokens: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    box = browser.find_element(By.ID, "max-tokens")
    box.clear()
    box.send_keys(max_tokens)
    browser.find_element(By.ID, "run").click()
    WebDriverWait(browser, 120).until(lambda b: b.find_elements(By.ID, "speedup")
                                      or b.find_elements(By.CSS_SELECTOR, ".error"))
    assert not browser.find_elements(By.CSS_SELECTOR, ".error"), browser.find_element(By.ID, "summary").text
    generated = "return document.querySelector(arguments[0] + ' .generated').textContent"
    return browser.execute_script(generated, "#plain-output"), browser.execute_script(generated, "#spec-output")


def test_playground_runs_plain_then_speculative_and_shows_identical_texts(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server + "/")
    WebDriverWait(browser, 60).until(lambda b: "γ = 4" in b.find_element(By.ID, "spec-title").text)
    assert browser.find_element(By.ID, "gamma").get_attribute("value") == "4"
    plain, spec = _run(browser, "48")
    assert plain == spec and len(plain) > 0
    summary = browser.find_element(By.ID, "summary")
    assert summary.get_attribute("data-same") == "1" and "identical texts" in summary.text
    assert float(browser.find_element(By.ID, "speedup").text.split("×")[0]) > 0
    assert browser.find_elements(By.CSS_SELECTOR, "#spec-output .accepted"), "no accepted draft was coloured"
    assert not browser.find_elements(By.CSS_SELECTOR, "#plain-output .accepted")
    for marked in browser.find_elements(By.CSS_SELECTOR, "#spec-output [data-rejected]"):  # tooltips, not text
        assert "rejected" in marked.get_attribute("title") and "×" not in marked.text
    stats = browser.find_element(By.ID, "spec-stats").text
    assert "α" in stats and "τ" in stats and "tokens/s" in stats
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "playground.png"))


def test_playground_chat_tab_uses_the_chat_template(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server + "/")
    WebDriverWait(browser, 60).until(lambda b: "γ = 4" in b.find_element(By.ID, "spec-title").text)
    browser.find_element(By.ID, "tab-chat").click()
    assert browser.find_element(By.ID, "user").is_displayed() and not browser.find_element(By.ID, "prompt").is_displayed()
    stop = browser.find_element(By.ID, "stop")
    stop.send_keys("\\n\\n")
    plain, spec = _run(browser, "32")
    assert plain == spec and len(plain) > 0 and "\n\n" not in plain
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "playground_chat.png"))
