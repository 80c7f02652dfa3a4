"""Retake the screenshots in docs/img with headless chromium (the browser the tests drive).

    python -m tests.report.screenshots HANDBOOK_DIR [IMG_DIR]

HANDBOOK_DIR is the --out of a finished `trainwreck handbook`. Writes handbook.png (the page's top),
handbook-async.png (chapter 11) and report-plots.png (the header and plots of the report of a caught
broken trainer). chromium's --screenshot ignores a #fragment, so a part of a page is shot from a copy
that holds only that part (the page's own <head>, so its CSS), never by editing the page.
"""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from tests.report.test_report_browser import chromium

REPORT_RUN = "sampler_not_saved"
"""Its loss leaves the golden curve and its coverage plot has replayed ids: every plot has something to show."""


def excerpt(page: str, *parts: str) -> str:
    """The page with only the given regex-matched parts of its body, in order."""
    head = page[:page.index("<main")]
    main = re.search(r"<main[^>]*>", page)
    assert main is not None, "not a trainwreck page: no <main>"
    body = []
    for part in parts:
        found = re.search(part, page, re.S)
        assert found is not None, f"the page has no part matching {part!r}"
        body.append(found.group(0))
    return head + main.group(0) + "\n".join(body) + "</main></body></html>\n"


def shoot(html: str, png: Path, size: str, scratch: Path) -> None:
    page = scratch / f"{png.stem}.html"
    page.write_text(html, encoding="utf-8")
    chromium(scratch, f"--screenshot={png}", f"--window-size={size}", page.as_uri())
    print(f"wrote {png}")


def main(handbook: Path, img: Path) -> None:
    index = (handbook / "index.html").read_text(encoding="utf-8")
    report = next(handbook.glob(f"runs/*-{REPORT_RUN}/report/report.html")).read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="trainwreck-shots-") as tmp:
        scratch = Path(tmp)
        shoot(index, img / "handbook.png", "1100,1900", scratch)
        shoot(excerpt(index, r'<section class="chapter" id="async">.*?</section>'), img / "handbook-async.png",
              "1100,1650", scratch)
        shoot(excerpt(report, r"<header>.*?</header>", r'<section id="plots">.*?</section>'),
              img / "report-plots.png", "1000,1700", scratch)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else Path("docs/img"))
