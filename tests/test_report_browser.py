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
        pytest.skip(
            f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium) to run the browser test"
        )
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
    page.on(
        "console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type in ("error", "warning") else None
    )
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: requests.append(r.url))
    page.set_default_timeout(15_000)
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length === {n_figures}", timeout=15_000)

    # every figure drew an SVG with its traces
    assert page.locator(".js-plotly-plot").count() == n_figures == 5
    per_plot = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => ({
        id: el.id, svgs: el.querySelectorAll('.main-svg').length,
        traces: el.querySelectorAll('.scatterlayer .trace, .barlayer .trace, .boxlayer .trace').length,
        height: el.getBoundingClientRect().height}))""")
    for plot in per_plot:
        assert plot["svgs"] >= 1 and plot["traces"] >= 1 and plot["height"] > 200, plot
    assert page.locator(".main-svg").count() >= n_figures
    # the short run is drawn step by step (line and bucket markers), with both spikes marked where the findings put them
    assert page.locator("#fig-curves .scatterlayer .trace .point").count() > 2000
    spike_x = page.evaluate(
        "document.getElementById('fig-curves').data.filter(t => t.name.startsWith('spike ('))"
        ".flatMap(t => Array.from(t.x))"
    )
    assert spike_x == [254, 258]
    assert errors == [], errors
    assert dialogs == [], "a script from the dataset ran"
    assert all(u.startswith(("file:", "data:", "blob:", "about:")) for u in requests), requests
    # the hostile sample text is visible as text
    text = page.inner_text("body")
    assert SCRIPT_TEXT in text
    assert "code def </script> return" in text
    assert "2 train/loss spikes (254, 258)" in text  # findings written without causes: the listed facts

    artifacts = repo_root / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    shot = artifacts / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    shutil.copy(path, artifacts / "report.html")
    assert shot.stat().st_size > 50_000

    # the card's button zooms the curves onto its spike
    page.locator('article[data-step="254"] button.zoom').click()
    page.wait_for_function(
        "(() => { const r = document.getElementById('fig-curves').layout.xaxis.range;"
        " return r && r[1] - r[0] < 200; })()"
    )
    x0, x1 = page.evaluate("document.getElementById('fig-curves').layout.xaxis.range")
    assert x0 < 254 < x1 and x1 - x0 < 200

    assert errors == [], errors
    page.close()


def test_bucketed_demo_report_draws_every_bucket_in_chromium(browser, demo_small, tmp_path, repo_root, capsys):
    """Downsampled per bucket, after the split: every bucket in the data has its own trace and its own extremes."""
    import json

    import pandas as pd

    from forensics.cli import main

    out = tmp_path / "report.html"
    assert main(["audit", str(demo_small / "bucketed"), "--json", str(tmp_path / "f.json"), "--html", str(out)]) == 0
    capsys.readouterr()
    assert main(["tag", str(demo_small / "bucketed"), "-o", str(tmp_path / "tags.parquet")]) == 0
    capsys.readouterr()
    buckets = sorted(pd.read_parquet(tmp_path / "tags.parquet")["bucket"].unique().tolist())
    assert len(buckets) == 6 and json.loads((tmp_path / "f.json").read_text())["spikes"] == []
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(out.as_uri(), wait_until="load")
    page.wait_for_function("document.getElementById('fig-curves') && document.getElementById('fig-curves').data")
    traces = page.evaluate("""() => document.getElementById('fig-curves')._fullData
        .filter(t => t.mode === 'markers' && t.legendgroup && t.legendgroup.startsWith('b'))
        .map(t => { const y = Array.from(t.y); return {group: t.legendgroup, n: y.length,
                    lo: y.reduce((a, b) => Math.min(a, b)), hi: y.reduce((a, b) => Math.max(a, b))}; })""")
    assert sorted(int(t["group"][1:]) for t in traces) == buckets
    assert all(t["n"] > 100 and t["hi"] > t["lo"] for t in traces), traces
    drawn = page.evaluate("document.querySelectorAll('#fig-curves .scatterlayer .trace').length")
    assert drawn >= len(buckets)
    artifacts = repo_root / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    page.screenshot(path=str(artifacts / "report-bucketed.png"), full_page=False)
    assert (artifacts / "report-bucketed.png").stat().st_size > 20_000
    assert errors == [], errors
    page.close()
