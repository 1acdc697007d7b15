"""The explorer in a real browser: Debian's Chromium, driven by Playwright."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(seeded):
    port = free_port()
    env = {**os.environ, "DATABASE_URL": seeded, "NCAT_QUEUE": "browser-tests-no-worker"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "ui/app.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise AssertionError("streamlit did not start") from None
            time.sleep(0.3)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


def top_row_link(url) -> str:
    from schema import store
    from ui.views.common import neuron_link

    with store.connect(url) as conn:
        row = conn.execute(
            "SELECT n.model_id, n.checkpoint_id, n.config_id, n.layer, n.neuron FROM neuron_op n "
            "JOIN checkpoint c ON c.id = n.checkpoint_id ORDER BY c.step DESC, "
            "n.effect_exact DESC NULLS LAST, n.layer, n.neuron, n.op LIMIT 1").fetchone()
    return neuron_link(*row)


def test_search_open_a_neuron_and_see_its_charts(server, seeded):
    assert Path(CHROMIUM).exists(), "Debian's chromium package is missing (scripts/setup.sh)"
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.goto(f"{server}/search", wait_until="networkidle")
        page.get_by_text("neuron-operator rows match").wait_for(timeout=60_000)
        # The results grid is drawn on a canvas, so its links are not DOM anchors: open the
        # link of the top row (largest effect at the last checkpoint) as the table builds it.
        href = top_row_link(seeded)
        page.goto(server + href, wait_until="networkidle")
        page.get_by_text("Activation grids (K map)").wait_for(timeout=60_000)
        page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
        page.get_by_text("Across training").scroll_into_view_if_needed()
        page.wait_for_function(
            "document.querySelectorAll('.js-plotly-plot').length >= 8", timeout=60_000)
        titles = " ".join(page.locator(".js-plotly-plot .gtitle").all_text_contents())
        assert "K map, +" in titles and "KV map" in titles
        assert "Patching effect" in titles and "Best heuristic score" in titles
        heat = page.locator(".js-plotly-plot .heatmaplayer image, .js-plotly-plot .hm image")
        assert heat.count() >= 4  # heatmaps drawn as images
        page.screenshot(path=str(ARTIFACTS / "neuron-page.png"), full_page=True)
        browser.close()
    assert (ARTIFACTS / "neuron-page.png").stat().st_size > 10_000
