"""The HTML report in a real headless browser (Debian's chromium): laid out, drawn, no network.

Three checks: the DOM the browser built holds the timeline SVG with its lanes and, for a
failing run, the evidence; a probe script injected into a *copy* of the report measures
the real layout (the report itself has no script); and a screenshot's pixels show the
verdict badge and the timeline's bars in their colours.
"""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest

from trainwreck.report import render_report
from tests.report.rundirs import duplicated_sample_run, killed_run

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (CI: apt-get install -y --no-install-recommends chromium)")

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars")


def chromium(tmp_path: Path, *args: str) -> str:
    """Run headless chromium with a throwaway profile; its stdout (the DOM for --dump-dom)."""
    cmd = [str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"chromium failed ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def failing_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return render_report(duplicated_sample_run(tmp_path_factory.mktemp("browser") / "dup-sample"))


def test_the_browser_dom_holds_the_timeline_lanes_and_the_failing_evidence(failing_report: Path,
                                                                          tmp_path: Path) -> None:
    dom = chromium(tmp_path, "--dump-dom", failing_report.as_uri())
    assert 'data-verdict="INVALID"' in dom
    assert 'class="tw-timeline"' in dom
    assert dom.count('class="tw-lane"') == 2  # one attempt, two ranks
    assert "ids used twice: 5,7" in dom
    assert 'data-name="coverage" data-valid="INVALID"' in dom


PROBE = """<script>
const box = (el) => { const r = el.getBoundingClientRect(); return [Math.round(r.width), Math.round(r.height)]; };
const probe = {
  timeline: box(document.querySelector("svg.tw-timeline")),
  lanes: [...document.querySelectorAll("svg.tw-timeline g.tw-lane")].map((g) => box(g)),
  bars: document.querySelectorAll("svg.tw-timeline rect.tw-lineage").length,
  evidence: [...document.querySelectorAll("ul.evidence li")].filter((li) => li.offsetHeight > 0)
            .map((li) => li.textContent),
  images: document.images.length,
  stylesheets: [...document.styleSheets].filter((s) => s.href).length,
};
document.body.setAttribute("data-probe", JSON.stringify(probe));
</script>"""


def test_the_timeline_and_evidence_have_real_size_once_laid_out(failing_report: Path, tmp_path: Path) -> None:
    probed = tmp_path / "probed.html"
    probed.write_text(failing_report.read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=2000", probed.as_uri())
    start = dom.index('data-probe="') + len('data-probe="')
    probe = json.loads(dom[start:dom.index('"', start)].replace("&quot;", '"').replace("&amp;", "&"))
    width, height = probe["timeline"]
    assert width >= 900 and height >= 60
    assert len(probe["lanes"]) == 2 and all(w > 500 and h >= 16 for w, h in probe["lanes"])
    assert probe["bars"] >= 2
    assert any("ids used twice: 5,7" in text for text in probe["evidence"])
    assert probe["images"] == 0 and probe["stylesheets"] == 0  # nothing loaded from elsewhere


def read_png(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB(A) rows of an 8-bit, non-interlaced PNG (what chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        header = chunk if kind == b"IHDR" else header
        idat += chunk if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6), f"unexpected PNG format depth={depth} color={color}"
    bpp = 4 if color == 6 else 3
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytes(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)]
        prev = _unfilter(kind, line, prev, bpp)
        rows.append(prev if bpp == 3 else bytes(v for i, v in enumerate(prev) if i % 4 != 3))
    return width, height, rows


def _unfilter(kind: int, line: bytes, prev: bytes, bpp: int) -> bytes:
    if kind == 0 or (kind == 2 and not line.strip(b"\0")):  # None, or Up of an unchanged row (most of a page)
        return line if kind == 0 else prev
    if kind == 2:
        return bytes((x + y) & 0xFF for x, y in zip(line, prev))
    out = bytearray(line)
    for i in range(len(out)):
        a = out[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        out[i] = (out[i] + (0, a, b, (a + b) // 2, _paeth(a, b, c))[kind]) & 0xFF
    return bytes(out)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def colours(rows: list[bytes]) -> Counter[tuple[int, int, int]]:
    """How many pixels have each RGB colour (counted at C speed: zip and Counter)."""
    seen: Counter[tuple[int, int, int]] = Counter()
    for row in rows:
        seen.update(zip(row[0::3], row[1::3], row[2::3]))
    return seen


def near(seen: Counter[tuple[int, int, int]], rgb: tuple[int, int, int], tolerance: int = 12) -> int:
    """Pixels within `tolerance` of a colour per channel (anti-aliasing and colour management shift a little)."""
    return sum(n for c, n in seen.items() if all(abs(c[k] - rgb[k]) <= tolerance for k in range(3)))


def test_a_screenshot_shows_the_verdict_badge_and_the_timeline_bars(tmp_path: Path) -> None:
    html = render_report(killed_run(tmp_path / "killed"))
    shot = tmp_path / "shot.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1000,1100", html.as_uri())
    width, height, rows = read_png(shot)
    assert (width, height) == (1000, 1100)
    top, page = colours(rows[:80]), colours(rows)
    assert near(top, (0x15, 0x80, 0x3D)) > 200  # the green VALID badge at the top
    assert near(page, (0x25, 0x63, 0xEB)) > 2000  # lineage bars of the timeline
    assert near(page, (0xF5, 0x9E, 0x0B)) > 50  # the hatched redo work after the kill
