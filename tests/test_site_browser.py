"""The site in a real headless Chromium (Debian's `chromium` and `chromium-driver`, driven by selenium):
the index loads without a console error and filters by GPU, a run page's figures load, the history
flags a planted regression and nothing between two identical runs.

`make test-browser` installs Chromium when missing (root) and runs these; without Chromium they skip,
saying why, and TFLA_BENCH_BROWSER_REQUIRED=1 (CI) makes that a failure.
"""

from __future__ import annotations

import os
import shutil

import pytest
from synthetic_run import PLANTED_FACTOR, site_runs

from tfla_bench.analyse.site import build_site

pytestmark = pytest.mark.browser

# The flags that keep a headless Chromium to itself: no GPU, no sandbox (root in CI), no network of its own.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)
LOAD_TIMEOUT_S = 30


def _missing() -> str | None:
    for name in ("chromium", "chromedriver"):
        if shutil.which(name) is None:
            return f"{name} is not installed (make test-browser installs Debian's chromium, chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    missing = _missing()
    if missing is not None:
        if os.environ.get("TFLA_BENCH_BROWSER_REQUIRED"):
            pytest.fail(f"TFLA_BENCH_BROWSER_REQUIRED is set, but {missing}")
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(LOAD_TIMEOUT_S)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    runs = site_runs(root / "runs", lengths=(8192, 65536))
    built = build_site([root / "runs"], root / "out", lambda line: None, jobs=2)
    # Two identical runs alone: their history must flag nothing.
    same = build_site(runs[:2], root / "same", lambda line: None, jobs=2)
    return built, same


def _errors(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def _open(driver, path) -> None:
    driver.get(path.resolve().as_uri())
    _errors(driver)  # the log of the page before is read and dropped


def _visible_rows(driver) -> int:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#runs tbody tr')).filter(r => !r.hidden).length"
    )


def test_a_console_error_is_seen(browser, tmp_path):
    # The check below can fail: a page whose script throws is caught.
    page = tmp_path / "broken.html"
    page.write_text("<!doctype html><html><body><script>noSuchFunction();</script></body></html>")
    browser.get(page.as_uri())
    assert any("noSuchFunction" in message for message in _errors(browser))


def test_index_loads_without_console_error(browser, site):
    built, _ = site
    browser.get(built.index.resolve().as_uri())
    assert browser.title == "tfla-bench: every run"
    assert _visible_rows(browser) == 4
    assert _errors(browser) == []


def test_filtering_by_gpu_changes_the_rows_shown(browser, site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    built, _ = site
    _open(browser, built.index)
    gpu = Select(browser.find_element(By.CSS_SELECTOR, 'select.filter[data-key="gpu"]'))
    gpu.select_by_value("NVIDIA H200")
    assert _visible_rows(browser) == 1
    assert browser.find_element(By.ID, "shown").text == "1"
    gpu.select_by_value("NVIDIA H100 80GB HBM3")
    assert _visible_rows(browser) == 3
    kernel = Select(browser.find_element(By.CSS_SELECTOR, 'select.filter[data-key="kernel"]'))
    kernel.select_by_value("tfla_sig")  # every run here ran it
    assert _visible_rows(browser) == 3
    gpu.select_by_value("")
    assert _visible_rows(browser) == 4
    assert _errors(browser) == []


def _loaded_images(driver) -> list[tuple[str, int]]:
    """Every image of the page after scrolling it into view (they load lazily), with its width."""
    return driver.execute_async_script(
        """
        var done = arguments[arguments.length - 1];
        var images = Array.from(document.images);
        images.forEach(function (img) { img.loading = "eager"; img.scrollIntoView(); });
        Promise.all(images.map(function (img) {
          return img.complete ? null : new Promise(function (ok) { img.onload = img.onerror = ok; });
        })).then(function () { done(images.map(function (img) { return [img.src, img.naturalWidth]; })); });
        """
    )


def test_a_run_pages_figures_load(browser, site):
    built, _ = site
    run = next(r for r in built.runs if r.rows.name.endswith("-c"))
    _open(browser, built.index.parent / run.page)
    images = _loaded_images(browser)
    assert len(images) >= 2
    assert all(src.startswith("file://") and width > 0 for src, width in images), images
    assert _errors(browser) == []


def test_history_flags_the_planted_regression_and_its_selector_switches_the_figure(browser, site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    built, _ = site
    _open(browser, built.index.parent / "history" / "fig5_consttoken.html")
    assert "1 change(s) beyond the noise" in browser.find_element(By.ID, "history-lead").text
    flagged = browser.find_elements(By.CSS_SELECTOR, "#flagged tbody tr")
    assert [row.find_elements(By.TAG_NAME, "td")[-1].text for row in flagged] == ["slower"]
    assert f"{PLANTED_FACTOR:.3f}" in flagged[0].text and "tfla_sig" in flagged[0].text
    select = browser.find_element(By.CSS_SELECTOR, "select.case-select")
    image = browser.find_element(By.ID, select.get_attribute("data-img"))
    before = image.get_attribute("src")
    options = Select(select).options
    Select(select).select_by_index(len(options) - 1 if options[0].is_selected() else 0)
    assert image.get_attribute("src") != before
    assert all(width > 0 for _, width in _loaded_images(browser))
    assert _errors(browser) == []


def test_history_of_two_identical_runs_flags_nothing(browser, site):
    from selenium.webdriver.common.by import By

    _, same = site
    _open(browser, same.index.parent / "history" / "fig5_consttoken.html")
    assert browser.find_element(By.ID, "history-lead").text.startswith("No change beyond the noise")
    assert browser.find_elements(By.CSS_SELECTOR, "#flagged tbody tr") == []
    assert _errors(browser) == []
