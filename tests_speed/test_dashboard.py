"""The history's page and summary: what they show, and the page in a real headless browser (Debian's Chromium)."""

from __future__ import annotations

import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness import REPO_ROOT

from harness.run import installed
from harness.nightly.changes import check_history
from harness.nightly.dashboard import page_html, summary_markdown
from harness.nightly.history import load_history
from tests_speed.test_history import STEADY, nightly

SCREENSHOT = REPO_ROOT / "out" / "dashboard" / "history.png"  # kept: CI uploads out/
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
NEEDS_BROWSER = ("needs Debian's Chromium and its driver: `bash scripts/install.sh` installs them (apt-get install "
                 "chromium chromium-driver) and selenium (pyproject group test)")


@pytest.fixture
def regressed(tmp_path):
    """A history of three points over 15 nights; `b` got 12% slower on night 13."""
    history = nightly(tmp_path, STEADY + [1.0, 1.002, 0.998], point="a", b=0.5, c=7.0)
    h = load_history(history)
    for night in h.nights[12:]:
        night.points["b"]["samples"] = [s * 1.12 for s in night.points["b"]["samples"]]
    return h, check_history(h)


class Sections(HTMLParser):
    def __init__(self):
        super().__init__()
        self.points, self.alarms, self.tags = [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if tag == "section":
            self.points.append(attrs.get("data-point"))
        if tag == "div" and attrs.get("class") == "alarm":
            self.alarms.append(attrs.get("data-point"))


def test_the_page_has_every_point_and_the_alarm_on_top(regressed):
    h, reports = regressed
    text = page_html([(h, reports)])
    parsed = Sections()
    parsed.feed(text)
    assert parsed.points == ["a", "b", "c"]
    assert parsed.alarms == ["b"]
    assert text.index('class="alarm"') < text.index("<section"), "the alarms are not above the plots"
    assert parsed.tags.count("svg") == 3 and "http" not in text.replace("http://www.w3.org", ""), "fetches something"
    assert "Test CPU" in text and "torch 2.14.1" in text, "machine and versions missing"


def test_the_summary_lists_the_alarm_first_with_the_command_that_accepts_it(regressed):
    h, reports = regressed
    text = summary_markdown(h, reports)
    assert text.index("this night fails") < text.index("| point |")
    alarm = [line for line in text.splitlines() if line.startswith("- **")]
    assert len(alarm) == 1 and "**b**" in alarm[0] and "12.0% slower" in alarm[0], alarm
    assert f"--night {h.nights[12].id}" in alarm[0]
    assert text.count("**SLOWER**") == 1


def console_errors(driver) -> list:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        installed.missing(NEEDS_BROWSER)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        installed.missing(NEEDS_BROWSER)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=900,1400"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    yield driver
    driver.quit()


def test_the_page_loads_in_chromium_without_errors_and_shows_the_regression(browser, regressed, tmp_path):
    from selenium.webdriver.common.by import By

    h, reports = regressed
    page = tmp_path / "index.html"
    page.write_text(page_html([(h, reports)]))
    browser.get(page.as_uri())
    assert console_errors(browser) == []
    sections = browser.find_elements(By.CSS_SELECTOR, "section.point")
    assert [s.get_attribute("data-point") for s in sections] == ["a", "b", "c"]
    assert all(s.is_displayed() for s in sections)
    alarms = browser.find_elements(By.CSS_SELECTOR, "#alarms .alarm")
    assert [a.get_attribute("data-point") for a in alarms] == ["b"] and "12.0% slower" in alarms[0].text
    browser.find_element(By.ID, "only-alarms").click()  # the page's one script: only the alarmed point stays
    assert [s.get_attribute("data-point") for s in sections if s.is_displayed()] == ["b"]
    assert console_errors(browser) == []
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    browser.find_element(By.ID, "only-alarms").click()
    assert browser.save_screenshot(str(SCREENSHOT)) and SCREENSHOT.stat().st_size > 10_000


def test_the_browser_check_sees_a_script_error(browser, tmp_path):
    """The console check can fail: a page whose script throws shows up as a SEVERE entry."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><script>undefinedFunction();</script></body></html>")
    browser.get(Path(page).as_uri())
    errors = console_errors(browser)
    assert errors and "undefinedFunction" in errors[0]["message"], errors


def test_a_changed_mix_of_exact_counts_is_shown_as_a_failure_and_can_be_accepted(tmp_path, capsys):
    """Four adds turned into four exps (totals equal): the summary and the page show it among the failures, named
    by operator, with the command that accepts it; `history accept` takes it, and the night passes."""
    from harness.nightly.history import History, Night, main, night_id, save_history

    def night(day: int, by_kind: dict) -> Night:
        points = {"c": {"metric": "ops", "samples": [100.0],
                        "extra": {"bytes": 4096, "flops": 10, "by_kind": by_kind}}}
        date = f"2026-11-{day:02d}T03:17:00+00:00"
        return Night(id=night_id(date, f"{day:040x}", points), date=date, commit=f"{day:040x}", command="test",
                     machine={"cpu_model": "Test CPU"}, points=points)

    base = {"aten.mm.default": 8, "aten.add.Tensor": 92}
    mixed = {"aten.mm.default": 8, "aten.add.Tensor": 88, "aten.exp.default": 4}
    path = tmp_path / "structure.json"
    h = History(machine_key="cpu-test", nights=[night(1, base), night(2, base), night(3, mixed)], path=path)
    save_history(h, path)
    h = load_history(path)
    reports = check_history(h)
    text = summary_markdown(h, reports)
    assert "1 changed mix(es) of exact counts: this night fails" in text, text
    [alarm] = [line for line in text.splitlines() if line.startswith("- **c**")]
    assert "aten.exp.default: 0 -> 4 calls (+4)" in alarm and f"--night {h.nights[2].id}" in alarm, alarm
    assert "**CHANGED MIX**" in text
    parsed = Sections()
    parsed.feed(page_html([(h, reports)]))
    assert parsed.alarms == ["c"]
    assert main(["check", str(path)]) == 1
    assert main(["accept", str(path), "c", "--night", h.nights[2].id, "--reason", "exp on purpose"]) == 0
    assert main(["check", str(path)]) == 0
