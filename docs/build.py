"""Build the documentation site and check its internal links: the one documented build command.

    python docs/build.py                    # strict: any Sphinx warning fails the build
    python docs/build.py --allow-warnings   # the warnings are collected and summed up, not fatal
    python docs/build.py --incremental      # re-read only the changed pages (a quick look)

Runs ``python -m sphinx -n -b html docs docs/_build/html`` (with ``-W --keep-going`` when
strict), writing every warning to ``docs/_build/warnings.txt``; then checks that every ``href``
and ``src`` of the built HTML that points into the site resolves: the file exists and, for a
``#fragment``, the page has an element with that id. External links are not checked (the build
machines reach no web site). Exits non-zero when Sphinx fails (in every mode: a failing example,
a public name without an API page, a broken page), when a warning is emitted in strict mode, or
when an internal link is broken.
"""

from __future__ import annotations

import argparse
import collections
import html.parser
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

DOCS = Path(__file__).resolve().parent


class _Page(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[tuple[str, str]] = []  # (attribute, url)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name") and (name == "id" or tag == "a"):
                self.ids.add(value)
            elif name in ("href", "src") and tag in ("a", "link", "img", "script", "source", "iframe"):
                self.links.append((f"<{tag} {name}>", value))


def check_links(root: Path) -> list[str]:
    """Every internal href/src of the HTML under ``root``: the broken ones, as messages."""
    pages: dict[Path, _Page] = {}
    for path in sorted(root.rglob("*.html")):
        if path.relative_to(root).parts[0] == "_static":  # the theme's templates, not pages
            continue
        parser = _Page()
        parser.feed(path.read_text(encoding="utf-8", errors="replace"))
        pages[path.resolve()] = parser
    broken = []
    for path, page in pages.items():
        for what, url in page.links:
            parts = urlsplit(url)
            if parts.scheme or url.startswith("//") or url.startswith("mailto:") or url.startswith("javascript:"):
                continue
            if not parts.path:
                target = path
            else:
                target = (path.parent / unquote(parts.path)).resolve()
                if target.is_dir():
                    target = target / "index.html"
            rel = path.relative_to(root.resolve())
            if not target.is_relative_to(root.resolve()):
                broken.append(f"{rel}: {what} {url}: leaves the site")
                continue
            if not target.exists():
                broken.append(f"{rel}: {what} {url}: no such file")
                continue
            frag = unquote(parts.fragment)
            if frag and target.suffix == ".html" and frag not in pages[target].ids:
                broken.append(f"{rel}: {what} {url}: no element with id {frag!r} in {target.relative_to(root.resolve())}")
    return broken


_LOCATION = re.compile(r"^(?:(?P<where>.*?):(?:(?P<line>\d+):)? )?(?P<level>WARNING|ERROR|CRITICAL): (?P<msg>.*)$")


def summarize(warnings: str) -> list[str]:
    """The warnings counted by kind (``[ref.class]`` and the like, or the message's start)."""
    kinds: collections.Counter[str] = collections.Counter()
    for line in warnings.splitlines():
        m = _LOCATION.match(line)
        if not m:
            continue
        msg = m.group("msg")
        tag = re.search(r"\[([a-z_.]+)\]\s*$", msg)
        if tag:
            kind = tag.group(1)
        else:
            kind = re.sub(r"[:\"'`].*", "", msg)[:60].strip() or "other"
        kinds[kind] += 1
    return [f"{count:5d}  {kind}" for kind, count in kinds.most_common()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--allow-warnings", action="store_true",
                    help="do not fail on Sphinx warnings: collect them in docs/_build/warnings.txt and count them by kind")
    ap.add_argument("--out", type=Path, default=DOCS / "_build", help="the build directory (default docs/_build)")
    ap.add_argument("--jobs", "-j", default="1", help="Sphinx's parallel jobs (default 1)")
    ap.add_argument("--no-execute", action="store_true", help="do not run the pages' code cells (a quick look at the prose)")
    ap.add_argument("--incremental", action="store_true",
                    help="re-read only the changed pages (quicker, but the warnings of unchanged pages are not reported again)")
    args = ap.parse_args(argv)

    html_dir = args.out / "html"
    warnings_file = args.out / "warnings.txt"
    args.out.mkdir(parents=True, exist_ok=True)
    # the HTML is written afresh (no page of an earlier build stays behind to be link-checked);
    # the doctrees and the notebooks' cache are kept
    shutil.rmtree(html_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "sphinx", "-q", "-n", "-b", "html", "-j", str(args.jobs), "-w", str(warnings_file),
           "-d", str(args.out / "doctrees")]
    if not args.incremental:
        cmd.append("-E")  # every page read afresh, so that every warning is reported
    if not args.allow_warnings:
        cmd += ["-W", "--keep-going"]
    cmd += [str(DOCS), str(html_dir)]
    env = dict(os.environ)
    if args.no_execute:
        env["PERMK_DOCS_EXECUTE"] = "off"
    print("+", " ".join(cmd), flush=True)
    start = time.monotonic()
    code = subprocess.call(cmd, cwd=DOCS.parent, env=env)
    took = time.monotonic() - start

    text = warnings_file.read_text(encoding="utf-8") if warnings_file.exists() else ""
    summary = summarize(text)
    total = sum(int(s.split()[0]) for s in summary)
    print(f"sphinx: exit {code} in {took:.0f} s; {total} warning(s), listed in {warnings_file}")
    for line in summary:
        print(line)
    if code != 0:
        print("docs build FAILED" + ("" if args.allow_warnings else " (strict mode: every warning is an error;"
                                     " --allow-warnings collects them instead)"), file=sys.stderr)
        return code

    broken = check_links(html_dir)
    pages = sum(1 for p in html_dir.rglob("*.html") if p.relative_to(html_dir).parts[0] != "_static")
    if broken:
        print(f"internal links: {len(broken)} broken in {pages} pages:", file=sys.stderr)
        for b in broken:
            print("  " + b, file=sys.stderr)
        return 1
    print(f"internal links: all resolve ({pages} pages)")
    print(f"site: {html_dir / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
