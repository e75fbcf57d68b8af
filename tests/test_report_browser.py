"""The report in a real browser: headless Debian Chromium driven by playwright, offline, no console errors.

Browser downloads are impossible here, so the test uses the system's ``/usr/bin/chromium`` (``.ci/run`` installs
Debian's package when missing) and skips, saying why, where it or playwright is absent.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from forensics.report import report_figures, write_report

CHROMIUM = Path("/usr/bin/chromium")
SCRIPT_TEXT = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium) to run the browser test")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"], timeout=30_000)
        yield b
        b.close()


def test_report_renders_offline_in_chromium_with_hostile_text_shown_as_text(browser, tmp_path, repo_root):
    from test_report import synthetic_case  # the same synthetic run as the unit tests (tests/ is on sys.path)

    case = synthetic_case(with_nan=True)
    inputs = {k: case[k] for k in ("findings", "metrics", "tags", "samples", "plan")}
    n_figures = len(report_figures(**inputs))
    path = write_report(tmp_path / "report.html", **inputs)

    page = browser.new_page(viewport={"width": 1300, "height": 900})
    errors: list[str] = []
    dialogs: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: requests.append(r.url))
    page.set_default_timeout(15_000)
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function(
        f"document.querySelectorAll('.js-plotly-plot').length === {n_figures}", timeout=15_000)

    # every figure drew an SVG with its traces
    assert page.locator(".js-plotly-plot").count() == n_figures == 5
    per_plot = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => ({
        id: el.id, svgs: el.querySelectorAll('.main-svg').length,
        traces: el.querySelectorAll('.scatterlayer .trace, .barlayer .trace, .boxlayer .trace').length,
        height: el.getBoundingClientRect().height}))""")
    for plot in per_plot:
        assert plot["svgs"] >= 1 and plot["traces"] >= 1 and plot["height"] > 200, plot
    assert page.locator(".main-svg").count() >= n_figures
    # the short run is drawn step by step, with both spikes marked where the findings put them
    assert page.locator("#fig-curves .scatterlayer .trace .point").count() > 3000
    spike_x = page.evaluate("document.getElementById('fig-curves').data.filter(t => t.name === 'spike')"
                            ".flatMap(t => Array.from(t.x))")
    assert spike_x == [254, 258]
    assert errors == [], errors
    assert dialogs == [], "a script from the dataset ran"
    assert all(u.startswith(("file:", "data:", "blob:", "about:")) for u in requests), requests
    # the hostile sample text is visible as text
    text = page.inner_text("body")
    assert SCRIPT_TEXT in text
    assert "code def </script> return" in text
    assert "2 train/loss spikes (254, 258)" in text

    artifacts = repo_root / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    shot = artifacts / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    shutil.copy(path, artifacts / "report.html")
    assert shot.stat().st_size > 50_000

    # the card's button zooms the curves onto its spike
    page.locator('article[data-step="254"] button.zoom').click()
    page.wait_for_function("(() => { const r = document.getElementById('fig-curves').layout.xaxis.range;"
                           " return r && r[1] - r[0] < 200; })()")
    x0, x1 = page.evaluate("document.getElementById('fig-curves').layout.xaxis.range")
    assert x0 < 254 < x1 and x1 - x0 < 200

    assert errors == [], errors
    page.close()
