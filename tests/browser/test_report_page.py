"""The capture report of a shared GPU trace (``sidecar analyze --html``), opened from its file in
headless Chromium: every section drawn, nothing fetched from anywhere, nothing said in the console,
and a ``<script>`` kernel name shown as text without running."""

from __future__ import annotations

import pytest

from report.hostile import KERNEL, OP, PROCESS, write_trace  # tests/report
from sidecar.analysis import analyze_path
from sidecar.report import write_html_report

from .conftest import ROOT, screenshot

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one browser for the module (conftest.py)

TRACES = ROOT.parent / "shared" / "traces"
SHOWN = TRACES / "a100-train-queue-rank0.json.gz"  # GPU steps, several streams, syncs: every section has something
SECTIONS = ("#headline", "#findings", "#downloads", "#timeline", "#devices", "#kernels", "#ops", "#gaps", "#syncs",
            "#collectives", "#steps")


@pytest.mark.skipif(not SHOWN.is_file(), reason=f"no shared trace {SHOWN}")
async def test_the_report_of_a_shared_gpu_trace(new_page, tmp_path):
    summary = analyze_path(SHOWN)
    out = write_html_report(summary, tmp_path / "report.html")
    page, console = await new_page()
    await page.goto(out.as_uri())
    assert await page.title() == "Capture report"
    for section in SECTIONS:
        assert await page.locator(section).is_visible(), section
    assert await page.locator(".headline").inner_text() == summary["headline"]
    assert await page.locator("#findings li").count() >= 5
    assert await page.locator("#timeline svg g.step").count() == len(summary["steps"])
    assert await page.locator("#timeline svg g.gap").count() == len(summary["gaps"]["largest"])
    assert await page.locator("#kernels svg g.bar").count() == len(summary["gpu"]["top_kernels"])
    # Drawn, not just present: the charts have a size on the screen.
    box = await page.locator("#devices svg").bounding_box()
    assert box and box["width"] > 500 and box["height"] > 20
    href = await page.locator("#downloads a[download]").first.get_attribute("href")
    assert (tmp_path / href).resolve() == SHOWN.resolve()
    await screenshot(page, "report.png", docs=True)
    assert console.problems() == []
    assert all(u.startswith(("file:", "data:")) for u in console.requests), console.requests


async def test_a_script_in_a_kernel_name_does_not_run(new_page, tmp_path):
    out = write_html_report(analyze_path(write_trace(tmp_path / "hostile.json")), tmp_path / "hostile.html")
    page, console = await new_page()
    await page.goto(out.as_uri())
    assert await page.evaluate("window.__pwned === undefined")
    assert KERNEL in await page.locator("#kernels").text_content()
    assert OP in await page.locator("#ops").text_content()
    assert PROCESS in await page.locator("#timeline h3").first.text_content()
    assert await page.locator("img").count() == 0
    await screenshot(page, "report-hostile.png")
    assert console.problems() == []
