"""scripts/check_report.sh: headless Chromium passes a fixture report and fails a broken one (skipped without
Chromium; .ci/run installs it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from report_fixtures import write_suite

from bench.report import build_report

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "check_report.sh"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium; "
                                                          ".ci/run installs it)")


def check(folder: Path, shot: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), str(folder), str(shot)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    suite = write_suite(tmp_path_factory.mktemp("browser"), completion="<script>alert(1)</script>")
    build_report(suite)
    return suite


def test_fixture_report_passes_and_is_screenshotted(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "page.png"
    proc = check(report, shot)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    assert not list(report.glob(".check_report.*"))  # the probe copy is removed


def test_broken_image_and_missing_section_fail(report: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(report, broken)
    (broken / "figures" / "curves.png").write_bytes(b"not a png")
    page = (broken / "index.html").read_text(encoding="utf-8")
    (broken / "index.html").write_text(page.replace('id="claims"', 'id="gone"'), encoding="utf-8")
    proc = check(broken, tmp_path / "b.png")
    assert proc.returncode == 1
    assert "figures/curves.png" in proc.stderr and "missing section: #claims" in proc.stderr


def test_console_error_fails(tmp_path: Path) -> None:
    folder = tmp_path / "js"
    folder.mkdir()
    (folder / "index.html").write_text('<html><head></head><body><h2 id="findings">x</h2><h2 id="claims">x</h2>'
                                       '<h2 id="headline">x</h2><h2 id="cite">x</h2><h2 id="results">x</h2>'
                                       '<h2 id="notes">x</h2><h2 id="environment">x</h2>'
                                       '<script>console.error("boom")</script></body></html>')
    proc = check(folder, tmp_path / "js.png")
    assert proc.returncode == 1 and "console.error: boom" in proc.stderr
