"""The explain page in a real headless Chromium (Debian's ``chromium``; CI installs it in .ci/run):
it renders, logs no console errors, and the screenshot shows the red violation marker."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

DEFERDUMP = str(Path(sys.executable).parent / "deferdump")
WINDOW = (1800, 1200)


def chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """One headless Chromium run with no network, no GPU and no first-run or background activity."""
    binary = shutil.which("chromium")
    assert binary is not None, "chromium is not installed (apt-get install -y chromium)"
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *extra, page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)


def console_errors(stderr: str) -> list[str]:
    """Lines where the page logged to the console or threw (Chromium logs them as ``:CONSOLE``)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def red_pixels(png: Path) -> int:
    """Pixels of the marker red (#b91c1c) or the clobbered-block red (#f87171)."""
    image = Image.open(png).convert("RGB")
    marks = {(0xB9, 0x1C, 0x1C), (0xF8, 0x71, 0x71)}
    return sum(count for count, colour in image.getcolors(maxcolors=1 << 20) or [] if colour in marks)


def test_console_check_catches_a_broken_page(tmp_path: Path) -> None:
    """The console check can fail: a page that throws is caught."""
    broken = tmp_path / "broken.html"
    broken.write_text('<!DOCTYPE html><p>x</p><script>console.error("boom"); missing();</script>', encoding="utf-8")
    out = chromium(broken, tmp_path / "profile", "--dump-dom")
    assert len(console_errors(out.stderr)) == 2, out.stderr


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``deferdump explain NoPreemptWait --html cx.html --svg cx.svg`` through the real CLI and TLC."""
    where = tmp_path_factory.mktemp("explain")
    out = subprocess.run([DEFERDUMP, "explain", "NoPreemptWait", "--html", str(where / "cx.html"),
                          "--svg", str(where / "cx.svg")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return where


def test_page_renders_without_console_errors(rendered: Path, tmp_path: Path) -> None:
    png = tmp_path / "cx.png"
    shot = chromium(rendered / "cx.html", tmp_path / "profile", f"--screenshot={png}",
                    f"--window-size={WINDOW[0]},{WINDOW[1]}")
    assert shot.returncode == 0, shot.stderr
    assert console_errors(shot.stderr) == []
    assert Image.open(png).size == WINDOW
    assert red_pixels(png) > 500, "the violating step's red frame is visible"

    dom = chromium(rendered / "cx.html", tmp_path / "profile", "--dump-dom")
    assert console_errors(dom.stderr) == []
    assert "<svg" in dom.stdout and 'data-marked="true"' in dom.stdout
    assert "NoOverwriteWhileDumpingInv" in dom.stdout


def test_standalone_svg_parses_in_the_browser(rendered: Path, tmp_path: Path) -> None:
    dom = chromium(rendered / "cx.svg", tmp_path / "profile", "--dump-dom")
    assert dom.returncode == 0, dom.stderr
    assert console_errors(dom.stderr) == []
    assert "<svg" in dom.stdout and "parsererror" not in dom.stdout
    png = tmp_path / "svg.png"
    chromium(rendered / "cx.svg", tmp_path / "profile", f"--screenshot={png}", "--window-size=1600,1000")
    assert red_pixels(png) > 500
