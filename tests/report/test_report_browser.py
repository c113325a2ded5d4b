"""report.html in a real browser (headless Debian Chromium through Selenium): the headline comes first, the detailed
tables are collapsed, the per-item drill-down's filters show exactly the outputs they name, model output is
escaped (a planted ``<img onerror>`` stays text), and the page logs no console error.

Skips when Chromium or chromedriver is missing, unless ``FORMTAX_BROWSER_REQUIRED=1`` (``scripts/test.sh`` sets it
after installing them, so in CI a missing browser fails the test instead of skipping it). With
``FORMTAX_SCREENSHOT=PATH`` it also writes the README's screenshot there.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from formtax.planted.world import write_world
from formtax.planted.worlds import BUILTIN
from formtax.report import write_report
from formtax.runner import RunConfig, run

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
INJECTED = '<img src=x onerror="window.__pwned=1"><b>bold?</b>'


def _browser():
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        if os.environ.get("FORMTAX_BROWSER_REQUIRED") == "1":
            pytest.fail(f"FORMTAX_BROWSER_REQUIRED=1 but {CHROMIUM} or {DRIVER} is missing")
        pytest.skip("Debian chromium / chromium-driver not installed (scripts/env-browser.sh installs them)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(DRIVER))


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("browser")
    world = str(write_world(BUILTIN["format-validity"](n_items=12, tokenizer="bytes"), base / "w.json"))
    out = base / "run"
    run(RunConfig(task="planted", backend="planted", model=world, task_options={"world": world},
                  strategies=["free", "constrained", "inwriting"], seeds=2, max_tokens=64), out)
    # a model output carrying markup: the report must show it as text
    path = out / "records.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    first["text"] = INJECTED + first["text"]
    first["phases"] = {}
    lines[0] = json.dumps(first)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_report(out, n_resamples=200)
    return out


def _expected(run_dir: Path) -> dict[str, dict[str, object]]:
    """Per item, from records.jsonl directly: its outputs' (strategy, outcome) and whether strategies disagree."""
    items: dict[str, dict[str, object]] = {}
    for line in (run_dir / "records.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r["error"]:
            result = "error"
        elif r["parses"]["strict"]["status"] != "ok":
            result = "unparsed"
        else:
            result = "correct" if r["scores"]["strict"] else "wrong"
        entry = items.setdefault(r["item_id"], {"outs": []})
        entry["outs"].append((r["strategy"], result))  # type: ignore[union-attr]
    for entry in items.values():
        results = {o for _, o in entry["outs"]}  # type: ignore[union-attr]
        entry["disagree"] = "correct" in results and len(results) > 1
    return items


def test_report_html_in_chromium(report_dir: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    expected = _expected(report_dir)
    driver = _browser()
    try:
        driver.get((report_dir / "report.html").resolve().as_uri())
        # findings first, then the summary; detailed tables collapsed; the run's configuration last
        headings = [h.get_attribute("id") for h in driver.find_elements(By.CSS_SELECTOR, "h2")]
        assert headings[:3] == ["findings", "summary", "figures"], headings
        assert headings.index("tables") < headings.index("items") < headings.index("run") == len(headings) - 1
        assert driver.find_elements(By.CSS_SELECTOR, "ul.findings li")
        details = driver.find_elements(By.CSS_SELECTOR, "details.table")
        assert details and not any(d.get_attribute("open") for d in details)
        assert driver.find_elements(By.CSS_SELECTOR, "#summary + p + h3")  # one summary table per task

        def visible() -> dict[str, list[tuple[str, str]]]:
            shown: dict[str, list[tuple[str, str]]] = {}
            for item in driver.find_elements(By.CSS_SELECTOR, "#drill .item"):
                if item.get_attribute("hidden") is not None:
                    continue
                outs = [(o.get_attribute("data-strategy"), o.get_attribute("data-outcome"))
                        for o in item.find_elements(By.CSS_SELECTOR, ".out") if o.get_attribute("hidden") is None]
                shown[item.get_attribute("data-item")] = outs
            return shown

        every = visible()
        assert set(every) == set(expected)
        assert all(sorted(every[i]) == sorted(expected[i]["outs"]) for i in expected)  # type: ignore[arg-type]

        strategy, outcome = Select(driver.find_element(By.ID, "f-strategy")), Select(driver.find_element(By.ID, "f-outcome"))
        strategy.select_by_value("free")
        shown = visible()
        assert shown and all(s == "free" for outs in shown.values() for s, _ in outs)
        assert len(shown) == len(expected)
        outcome.select_by_value("correct")
        shown = visible()
        want = {i for i, e in expected.items() if ("free", "correct") in e["outs"]}  # type: ignore[operator]
        assert set(shown) == want and want, (shown, want)
        strategy.select_by_value("")
        outcome.select_by_value("")
        driver.find_element(By.ID, "f-disagree").click()
        shown = visible()
        want = {i for i, e in expected.items() if e["disagree"]}
        assert set(shown) == want and want
        count = driver.find_element(By.ID, "f-count").text
        assert count.startswith(f"{len(want)} items")
        driver.find_element(By.ID, "f-disagree").click()

        # escaped model output: shown as text, never run
        assert driver.execute_script("return window.__pwned === undefined")
        texts = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#drill pre.text")]
        assert any(INJECTED in t for t in texts)
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
        target = os.environ.get("FORMTAX_SCREENSHOT")
        if target:  # the README's picture: the drill-down, items where strategies disagree
            driver.find_element(By.ID, "f-disagree").click()
            driver.execute_script("document.getElementById('items').scrollIntoView()")
            driver.save_screenshot(target)
    finally:
        driver.quit()


@pytest.mark.parametrize(("width", "height"), [(390, 844), (1400, 1000)])  # a phone, a desktop
def test_report_html_reads_at_a_phone_and_a_desktop_width(report_dir: Path, width: int, height: int) -> None:
    """No sideways scrolling of the page at either width (wide tables scroll inside their own box), the findings
    on the first screen; FORMTAX_SCREENSHOTS=DIR keeps the screenshots looked at for issue 38."""
    from selenium.webdriver.common.by import By

    driver = _browser()
    try:
        driver.set_window_size(width, height)
        driver.get((report_dir / "report.html").resolve().as_uri())
        inner = driver.execute_script("return document.documentElement.clientWidth")
        assert driver.execute_script("return document.documentElement.scrollWidth") <= inner + 1
        first = driver.find_element(By.CSS_SELECTOR, "ul.findings li")
        assert first.is_displayed() and first.location["y"] < height
        for img in driver.find_elements(By.CSS_SELECTOR, "figure img"):
            assert img.size["width"] <= inner
        target = os.environ.get("FORMTAX_SCREENSHOTS")
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(Path(target) / f"report-{width}.png"))
    finally:
        driver.quit()
