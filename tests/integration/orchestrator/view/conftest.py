"""The viewer's browser tests: the page served from a thread of the test process, Debian's Chromium driven
headless through Selenium and Debian's chromedriver. Without either (or without the selenium package) the tests
skip, saying what to install."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

# Debian's packages put them here (apt-get install chromium chromium-driver).
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
# The laptop screen the page is laid out for.
WINDOW = (1280, 900)


class ServedPage:
    """The viewer's app on a free loopback port, in an event loop of its own thread; `url` until `stop()`."""

    def __init__(self, run_dirs: list[Path]):
        from aiohttp import web

        from orchestrator.view.server import make_app

        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(make_app(run_dirs), access_log=None)
        ready = threading.Event()

        async def start() -> None:
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/"
            ready.set()

        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=30)
        assert ready.is_set()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


@pytest.fixture
def serve():
    """serve(run_dirs) -> the page's URL; stopped after the test."""
    pages: list[ServedPage] = []

    def start(run_dirs: list[Path]) -> str:
        pages.append(ServedPage(run_dirs))
        return pages[-1].url

    yield start
    for p in pages:
        p.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Chromium at 1280 px wide."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no Chromium: the browser tests need Debian's chromium and chromium-driver "
                    "(apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="the browser tests need the selenium package "
                                    "(pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars"):
        options.add_argument(arg)
    # The given driver: Selenium Manager would try to download one (offline clusters, CI without internet).
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()
