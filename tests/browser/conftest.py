"""Headless Chromium for the page tests: Debian's ``chromium`` (scripts/install-browser.sh installs it;
``make test`` runs that first), driven with Playwright's Python client pointed at /usr/bin/chromium.
Where Chromium or Playwright is missing the tests fail and say what to run: they are not skipped.

One browser per test module (a Chromium start costs seconds of a 2-core CI host's time): each module
runs its tests and fixtures on one module-wide event loop (``pytestmark`` there), so its sidecars are
served on that loop too (``sidecar`` below), not through pytest-aiohttp's per-test loop.

Screenshots go to ``$SIDECAR_TEST_ARTEFACTS/browser/`` (default ``.cache/test-artefacts/browser/``);
with ``SIDECAR_DOCS_SCREENSHOTS=1`` the ones docs/report.md shows are copied to docs/images/ too.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from sidecar.service.app import make_app
from test_service import settings

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("SIDECAR_CHROMIUM", "/usr/bin/chromium")
# No network beyond the page under test: no QUIC, no background fetches, updates or sync.
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTEFACTS = Path(os.environ.get("SIDECAR_TEST_ARTEFACTS", ROOT / ".cache" / "test-artefacts")) / "browser"
DOCS_IMAGES = ROOT / "docs" / "images"


def missing() -> str | None:
    try:
        import playwright.async_api  # noqa: F401 (only whether it imports)
    except ImportError:
        return "the playwright package is not installed (scripts/install-browser.sh)"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (scripts/install-browser.sh; SIDECAR_CHROMIUM to point elsewhere)"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: opens the sidecar's pages in headless Chromium (tests/browser)")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.browser)


class Console:
    """What a page said: console messages, uncaught errors, and every request it made."""

    def __init__(self, page) -> None:
        self.messages: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("console", lambda m: self.messages.append((m.type, m.text)))
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("request", lambda r: self.requests.append(r.url))

    def problems(self, allowed: tuple[str, ...] = ()) -> list[str]:
        """Errors and warnings, less those containing one of ``allowed`` (an expected 401 or 400)."""
        said = [f"{kind}: {text}" for kind, text in self.messages if kind in ("error", "warning", "assert")]
        return [p for p in said + [f"uncaught: {e}" for e in self.errors] if not any(a in p for a in allowed)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser():
    why = missing()
    if why:
        pytest.fail(why)
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest_asyncio.fixture(loop_scope="module")
async def new_page(browser):
    """``await new_page()`` -> (page, Console): a fresh context each (no storage shared between them)."""
    contexts = []

    async def make(**options):
        context = await browser.new_context(viewport={"width": 1200, "height": 900}, accept_downloads=True,
                                            **options)
        contexts.append(context)
        page = await context.new_page()
        return page, Console(page)

    yield make
    for context in contexts:
        await context.close()


@pytest_asyncio.fixture(loop_scope="module")
async def sidecar(tmp_path):
    """``await sidecar(**settings)`` -> a live sidecar (the real app on a real socket) on the module's loop,
    as an aiohttp ``TestClient`` with ``url``: its address for the browser and for probes."""
    clients = []

    async def make(**overrides):
        client = TestClient(TestServer(make_app(settings(tmp_path, **overrides)), host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        client.url = str(client.make_url("")).rstrip("/")
        return client

    yield make
    for client in clients:
        await client.close()


async def screenshot(page, name: str, *, docs: bool = False) -> Path:
    """The whole page as PNG among the test artefacts; ``docs``: also docs/images/ when asked to."""
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTEFACTS / name
    await page.screenshot(path=str(path), full_page=True)
    if docs and os.environ.get("SIDECAR_DOCS_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_IMAGES / name)
    return path
