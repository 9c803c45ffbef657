"""Headless Chromium loads every page of the quick book from a local HTTP server.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs
them). Without them the test is skipped with a message saying how to install
them, except under ``CI=true``, where it fails instead.

To check a book built by ``make book`` (any preset) instead of the quick
build, name its folder: ``CRS_BROWSER_BOOK=. .venv/bin/python -m pytest
tests/test_browser.py``.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import shutil
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest
from crslib.plots import COLUMN_LABELS
from realdata import LAYOUTS

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
INSTALL_HINT = "install Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)"
# Flags for a closed network: no background connections that would fail and
# flood the console, no sandbox (CI runs as root), a fresh profile.
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1280,1600")


def _require_chromium() -> None:
    if Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file():
        return
    message = f"headless Chromium not found ({CHROMIUM}, {CHROMEDRIVER}): {INSTALL_HINT}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def book_under_test(request) -> tuple[Path, Path]:
    """(book root, html folder): the quick build, or the book in $CRS_BROWSER_BOOK."""
    given = os.environ.get("CRS_BROWSER_BOOK")
    if not given:
        root, record = request.getfixturevalue("quick_book")
        return root, Path(record.html_index).parent
    root = Path(given).resolve()
    html_dir = root / "_build" / "html"
    if not (html_dir / "index.html").is_file():
        pytest.fail(f"CRS_BROWSER_BOOK={given}: no _build/html/index.html there; build it with make book")
    return root, html_dir


@contextlib.contextmanager
def _serve(html_dir: Path):
    """A built book's HTML served on localhost; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(html_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def site(book_under_test):
    """The built HTML served on localhost: (base URL, html folder)."""
    with _serve(book_under_test[1]) as base:
        yield base, book_under_test[1]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    _require_chromium()
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not try to download a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _pages(html_dir: Path) -> list[Path]:
    skip = {"_static", "_sources", "_images", "_sphinx_design_static", "_panels_static"}
    return sorted(p for p in html_dir.rglob("*.html")
                  if not any(part in skip or part.startswith(".") for part in p.relative_to(html_dir).parts))


#: Mean per-pixel standard deviation (0-255 grey levels) below which a figure counts as blank.
BLANK_FIGURE_STD = 2.0
_FIGURE_STD_JS = """
return Array.from(document.images).filter(i => (i.getAttribute('src') || '').includes('_images/') && i.naturalWidth)
  .map(i => {
    const w = Math.min(i.naturalWidth, 240), h = Math.max(1, Math.round(i.naturalHeight * w / i.naturalWidth));
    const c = document.createElement('canvas'); c.width = w; c.height = h;
    const g = c.getContext('2d'); g.fillStyle = '#fff'; g.fillRect(0, 0, w, h); g.drawImage(i, 0, 0, w, h);
    const d = g.getImageData(0, 0, w, h).data; let s = 0, s2 = 0, n = 0;
    for (let k = 0; k < d.length; k += 4) { const y = (d[k] + d[k + 1] + d[k + 2]) / 3; s += y; s2 += y * y; n++; }
    return [i.getAttribute('src'), Math.sqrt(Math.max(0, s2 / n - (s / n) ** 2))];
  });
"""
_TRUNCATED = re.compile(r"\d+ rows × \d+ columns")


def _reader_problems(rel: str, browser, machine_paths: tuple[str, ...]) -> list[str]:
    """What a reader must never meet on a page: stderr, truncated tables, machine paths, blank figures."""
    problems = []
    stderr = browser.execute_script("return Array.from(document.querySelectorAll('div.stderr, div.output.stderr'))"
                                    ".map(e => e.innerText.slice(0, 120));")
    problems += [f"{rel}: stderr shown: {text!r}" for text in stderr]
    text = browser.execute_script("return document.body.innerText;")
    if _TRUNCATED.search(text):
        problems.append(f"{rel}: a table has a 'rows x columns' footer (truncated)")
    cells = browser.execute_script("return Array.from(document.querySelectorAll('td, th')).map(c => c.innerText.trim());")
    if any(cell in ("...", "…") for cell in cells):
        problems.append(f"{rel}: a table has a '...' cell (truncated)")
    if rel.startswith("book/generated/"):  # the chapters' result tables show human column names
        headers = browser.execute_script(
            "return Array.from(document.querySelectorAll('th')).map(c => c.innerText.trim());")
        problems += [f"{rel}: a table header is the machine name {h!r}" for h in sorted(set(headers))
                     if COLUMN_LABELS.get(h, h) != h]  # a label equal to its name ('accuracy') is human
    source = browser.page_source
    problems += [f"{rel}: shows the machine path {path}" for path in machine_paths if path in source]
    for src, std in browser.execute_script(_FIGURE_STD_JS):
        if std < BLANK_FIGURE_STD:
            problems.append(f"{rel}: figure {src} is blank (pixel std {std:.2f})")
    return problems


def _open(browser, url: str) -> None:
    """Load a page and wait until its document is complete: on a loaded machine the driver can hand
    back control before the body exists (a CI run once found document.body null right after get)."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(url)
    WebDriverWait(browser, 60).until(
        lambda b: b.execute_script("return document.readyState === 'complete' && document.body !== null"))


def _check_pages(base: str, html_dir: Path, browser, shots: Path,
                 machine_paths: tuple[str, ...] = ()) -> tuple[list[str], dict[str, tuple[int, str]]]:
    """Load every page: the problems found, and per executed-notebook page (figures shown, its text)."""
    shots.mkdir(parents=True, exist_ok=True)
    pages = _pages(html_dir)
    problems: list[str] = []
    notebooks: dict[str, tuple[int, str]] = {}
    for page in pages:
        rel = page.relative_to(html_dir).as_posix()
        _open(browser, base + rel)
        browser.execute_script("window.scrollTo(0, document.body.scrollHeight)")  # load lazy images
        browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "Promise.all(Array.from(document.images).map(i => i.complete ? 0 : new Promise(r => {"
            "i.onload = i.onerror = r;}))).then(() => done());"
        )
        for entry in browser.get_log("browser"):
            if entry.get("level") == "SEVERE":
                problems.append(f"{rel}: console error: {entry.get('message')}")
        images = browser.execute_script(
            "return Array.from(document.images).map(i => [i.getAttribute('src'), i.naturalWidth, i.alt]);")
        problems += [f"{rel}: image not loaded: {src}" for src, width, _ in images if not width]
        problems += [f"{rel}: figure without alt text: {src}" for src, _, alt in images
                     if "_images/" in (src or "") and not (alt or "").strip()]
        problems += _reader_problems(rel, browser, machine_paths)
        if rel.startswith("book/generated/") and Path(rel).name[:2].isdigit():  # an executed notebook
            figures = sum(1 for src, width, _ in images if width and "_images/" in (src or ""))
            # the headings from the DOM too: innerText can miss off-screen parts of a long page (see below)
            notebooks[rel] = (figures, browser.execute_script(
                "return document.body.innerText + '\\n' + Array.from(document.querySelectorAll('h1, h2, h3'))"
                ".map(h => h.textContent).join('\\n');"))
        links = browser.execute_script("return Array.from(document.querySelectorAll('a[href]')).map(a => a.href);")
        for href in links:
            parsed = urlparse(href)
            if not href.startswith(base) or parsed.scheme not in ("http", "https"):
                continue
            target = html_dir / unquote(urldefrag(parsed.path)[0].lstrip("/"))
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                problems.append(f"{rel}: broken internal link {href}")
        browser.save_screenshot(str(shots / (rel.replace("/", "__") + ".png")))
    assert len(list(shots.glob("*.png"))) == len(pages)
    return problems, notebooks


@pytest.mark.slow
def test_every_page_loads_without_errors_with_images_and_working_links(site, browser, book_under_test) -> None:
    base, html_dir = site
    assert len(_pages(html_dir)) >= 10, [p.name for p in _pages(html_dir)]
    problems, notebooks = _check_pages(base, html_dir, browser, book_under_test[0] / "_build" / "screenshots",
                                       _machine_paths(book_under_test[0]))
    assert not problems, "\n".join(problems[:30])
    assert notebooks, "no notebook page was found under book/generated/"
    for rel, (count, _) in notebooks.items():
        assert count >= 1, f"{rel} shows no figure in the browser"
    _assert_claims_shown(html_dir, notebooks, browser, base)
    _assert_provenance_footers(notebooks)


def _machine_paths(root: Path) -> tuple[str, ...]:
    """The build's own folders (its run folders, its HTML, the repository), which no page may show.

    A researcher's own data path may appear (the parameters box names the data the chapter studied), so the
    book root itself, which holds the test's data folders, is not one of them.
    """
    repository = Path(__file__).resolve().parents[1]
    return tuple(dict.fromkeys(str(p) for p in (root.resolve() / "runs", root.resolve() / "_build",
                                                 repository / "runs", repository / "crslib")))


_FOOTER = re.compile(r"Provenance\. Commit ([0-9a-f]{40}(?:\+dirty)?|not recorded \(not a git checkout\)), "
                     r"run (\d{8}T\d{6}Z-\S+) \(preset \S+\)")


def _assert_provenance_footers(notebooks: dict[str, tuple[int, str]]) -> None:
    """Every chapter ends with its provenance footer, all naming one commit and one run; built from a
    git checkout (as the tests' own build is), the full commit hash."""
    from crslib.staging import git_commit

    found = {rel: _FOOTER.search(text) for rel, (_, text) in notebooks.items()}
    missing = [rel for rel, match in found.items() if match is None]
    assert not missing, f"no provenance footer on {missing}"
    commits = {match.group(1) for match in found.values()}
    assert len(commits) == 1 and len({match.group(2) for match in found.values()}) == 1, commits
    if git_commit() and not os.environ.get("CRS_BROWSER_BOOK"):
        assert not commits.pop().startswith("not recorded")


def _assert_claims_shown(html_dir: Path, notebooks: dict[str, tuple[int, str]], browser, base: str) -> None:
    """The claims page lists every ledger id; every study chapter ends with its *What this run shows* box."""
    from crslib.claims import CHAPTERS, CLAIM_IDS

    _open(browser, base + "book/generated/claims.html")
    # textContent, not innerText: the DOM's text does not depend on layout, which a loaded machine may not have
    # finished (a CI run once missed the table's last row through innerText)
    text = browser.execute_script("return document.body.textContent;")
    missing = [cid for cid in CLAIM_IDS if cid not in text]
    assert not missing, f"the claims page lacks {missing}"
    assert browser.execute_script("return document.querySelectorAll('span.crs-verdict').length;") == len(CLAIM_IDS)
    for chapter in CHAPTERS:
        page = f"book/generated/{chapter}.html"
        assert page in notebooks, f"no page {page}"
        assert "What this run shows" in notebooks[page][1], f"{page} has no What this run shows box"


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_book_on_real_images_loads_and_each_chapter_shows_a_figure_or_its_skips(own_books, browser,
                                                                                    layout) -> None:
    root, record, _ = own_books[layout]
    html_dir = Path(record.html_index).parent
    with _serve(html_dir) as base:
        problems, notebooks = _check_pages(base, html_dir, browser, root / "_build" / "screenshots",
                                           _machine_paths(root))
        assert not problems, "\n".join(problems[:30])
        assert len(notebooks) == 7, sorted(notebooks)
        for rel, (count, text) in notebooks.items():
            assert count >= 1 or "Skipped:" in text, f"{rel} shows neither a figure nor what it skipped"
        _assert_claims_shown(html_dir, notebooks, browser, base)
        _assert_provenance_footers(notebooks)


@pytest.mark.slow
def test_with_a_repository_url_the_study_pages_have_repository_issue_binder_and_colab_buttons(
        book_under_test, browser, tmp_path, request) -> None:
    from conftest import REPOSITORY_URL as url

    from crslib.runner import build_html

    if os.environ.get("CRS_BROWSER_BOOK"):  # a book of the user's: its staged chapters built with the URL, not rerun
        root, _ = book_under_test
        for name in ("_config.yml", "_toc.yml"):
            shutil.copy2(root / name, tmp_path / name)
        shutil.copytree(root / "book", tmp_path / "book")
        html_dir = build_html(book_root=tmp_path, repository_url=url).parent
    else:  # the quick book's, built once for this test and test_site's
        html_dir = request.getfixturevalue("quick_book_with_url")
    with _serve(html_dir) as base:
        for chapter in ("02_agreement", "06_representation_risk"):
            _open(browser, f"{base}book/generated/{chapter}.html")
            links = browser.execute_script(
                "return Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href'));")
            assert url in links, f"{chapter}: no repository button"
            assert any(link.startswith(f"{url}/issues") for link in links), f"{chapter}: no issue button"
            assert any(link.startswith("https://mybinder.org/v2/gh/example-org/crs-companion/main")
                       and f"notebooks/{chapter}.py" in link for link in links), f"{chapter}: no Binder button"
            assert any(link.startswith("https://colab.research.google.com/github/example-org/crs-companion/blob/")
                       and f"{chapter}.ipynb" in link for link in links), f"{chapter}: no Colab button"
            assert _FOOTER.search(browser.execute_script("return document.body.textContent;").replace("\n", " "))


@pytest.mark.parametrize("ci, outcome", [("", pytest.skip.Exception), ("true", pytest.fail.Exception)])
def test_missing_chromium_skips_outside_ci_and_fails_in_ci(monkeypatch, ci, outcome) -> None:
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="apt-get install -y chromium chromium-driver"):
        _require_chromium()
