#!/usr/bin/env python3
"""Relative links that work both on the repository's web view and in the Doxygen HTML.

The markdown pages (README.md, notebooks_md/*.md) link to files and folders of the repository
with paths relative to themselves: `../stages/05_cp_async/cp_async.cu`, `results/h200/`. A web
view of the repository follows them as they are. Doxygen writes every page into one flat html/
folder, where those paths lead nowhere, so the docs build (docs/CMakeLists.txt) uses this script:

    doc_links.py filter PAGES... FILE    Doxygen's input filter for *.md: a link to a repository
                                         file that is not a page becomes repo/<path> (a folder:
                                         repo/<path>/index.html), and a long page gets [TOC]
    doc_links.py copy HTML_DIR PAGES...  copies those link targets to HTML_DIR/repo/, with an
                                         index.html listing each linked folder
    doc_links.py check-html HTML_DIR     every relative href and src of the generated HTML
                                         resolves to a file (and #anchor to an id in it)
    doc_links.py check-markdown [FILE...]  every relative link of the repository's markdown
                                         (default: all tracked *.md) resolves, as a web view does

PAGES are the markdown files and folders Doxygen reads (its INPUT), relative to the repository
root. Standard library only.
"""

import html
import html.parser
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPY_PREFIX = "repo"
# A page with at least this many sections gets a table of contents in the HTML.
TOC_MIN_SECTIONS = 4

# [text](target) or ![alt](target "title"); text may hold one level of [brackets].
LINK = re.compile(r'(!?)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(\s+"[^"]*")?\s*\)')
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//|^#")


def markdown_pages(pages):
    """The .md files named in PAGES (files, or folders read non-recursively), relative paths."""
    found = []
    for page in pages:
        page = os.path.relpath(os.path.join(ROOT, page), ROOT)
        if os.path.isdir(os.path.join(ROOT, page)):
            found += sorted(os.path.join(page, f) for f in os.listdir(os.path.join(ROOT, page)) if f.endswith(".md"))
        elif page.endswith(".md"):
            found.append(page)
    return [os.path.normpath(p) for p in found]


def page_html(page, main_page="README.md"):
    """The HTML file Doxygen writes for a markdown page: index.html for the main page, else
    md_ and the path with '/' as '_' (notebooks_md/01_naive.md -> md_notebooks_md_01_naive.html)."""
    if os.path.normpath(page) == main_page:
        return "index.html"
    return "md_" + os.path.splitext(os.path.normpath(page))[0].replace(os.sep, "_") + ".html"


def prose_lines(lines):
    """(index, line) for the lines outside fenced code blocks."""
    fence = None
    for index, line in enumerate(lines):
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1) == fence:
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        yield index, line


def links(text):
    """(line index, match) for every inline link outside fenced code blocks and code spans."""
    for index, line in prose_lines(text.split("\n")):
        spans = [m.span() for m in CODE_SPAN.finditer(line)]
        for m in LINK.finditer(line):
            if not any(a <= m.start() < b for a, b in spans):
                yield index, m


def resolve(page, target):
    """(repository-relative path, '#fragment' or '') of a relative link, or None when the link
    is external, an in-page anchor, absolute, or leaves the repository."""
    if EXTERNAL.match(target) or target.startswith("/"):
        return None
    path, _, fragment = target.partition("#")
    if not path:
        return None
    resolved = os.path.normpath(os.path.join(os.path.dirname(page), path))
    if resolved.startswith(".."):
        return None
    return resolved, ("#" + fragment if fragment else "")


def is_copied(page, match, doc_pages):
    """Whether the docs build serves this link from repo/: a repository file that is neither a
    Doxygen page nor an image (Doxygen copies images from IMAGE_PATH itself)."""
    if match.group(1) == "!":
        return None
    resolved = resolve(page, match.group(3))
    if resolved is None or resolved[0] in doc_pages:
        return None
    return resolved


def copied_href(resolved):
    path, fragment = resolved
    suffix = "/index.html" if os.path.isdir(os.path.join(ROOT, path)) else ""
    return f"{COPY_PREFIX}/{path}{suffix}{fragment}"


# ----------------------------------------------------------------------------------------------

def command_filter(args):
    *pages, source = args
    doc_pages = set(markdown_pages(pages))
    page = os.path.relpath(os.path.abspath(source), ROOT)  # Doxygen passes an absolute path
    with open(source, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    for index, m in reversed(list(links(text))):
        line = lines[index]
        start, end = m.span(3)
        if m.group(1) == "!":
            # Doxygen copies an image it finds in IMAGE_PATH (docs, docs/img) into html/ under
            # its own name: a path relative to the page would lead nowhere there.
            image = resolve(page, m.group(3))
            if image is not None:
                lines[index] = line[:start] + os.path.basename(image[0]) + line[end:]
            continue
        resolved = is_copied(page, m, doc_pages)
        if resolved is None:
            continue
        lines[index] = line[:start] + copied_href(resolved) + line[end:]
    headings = [(index, line) for index, line in prose_lines(lines) if line.startswith("#")]
    sections = sum(1 for _, line in headings if line.startswith("## "))
    if sections >= TOC_MIN_SECTIONS and headings and headings[0][1].startswith("# "):
        lines.insert(headings[0][0] + 1, "\n[TOC]\n")  # under the page's title
    sys.stdout.write("\n".join(lines))


def write_index(html_dir, folder, doc_pages):
    """HTML_DIR/repo/<folder>/index.html: the folder's entries, pages linked to their HTML."""
    out_dir = os.path.join(html_dir, COPY_PREFIX, folder)
    up = "../" * (folder.count("/") + 2)  # from repo/<folder>/ back to HTML_DIR
    items = []
    for name in sorted(os.listdir(os.path.join(ROOT, folder))):
        path = os.path.join(folder, name)
        if os.path.isdir(os.path.join(ROOT, path)):
            write_index(html_dir, path, doc_pages)
            href, label = f"{name}/index.html", name + "/"
        elif path in doc_pages:
            href, label = up + page_html(path), name
        else:
            os.makedirs(out_dir, exist_ok=True)
            shutil.copyfile(os.path.join(ROOT, path), os.path.join(out_dir, name))
            href, label = name, name
        items.append(f'<li><a href="{html.escape(href)}">{html.escape(label)}</a></li>')
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "index.html"), "w", encoding="utf-8") as f:
        f.write(f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(folder)}/"
                f"</title></head>\n<body><p><a href=\"{up}index.html\">Fast attention</a> / "
                f"{html.escape(folder)}/</p>\n<ul>\n" + "\n".join(items) + "\n</ul></body></html>\n")


def command_copy(args):
    html_dir, *pages = args
    doc_pages = set(markdown_pages(pages))
    copied = set()
    for page in sorted(doc_pages):
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            text = f.read()
        for _, m in links(text):
            resolved = is_copied(page, m, doc_pages)
            if resolved is None or resolved[0] in copied:
                continue
            path = resolved[0]
            copied.add(path)
            source = os.path.join(ROOT, path)
            if os.path.isdir(source):
                write_index(html_dir, path, doc_pages)
            elif os.path.isfile(source):
                target = os.path.join(html_dir, COPY_PREFIX, path)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(source, target)
            # a missing target is left for check-html and check-markdown to report


class Anchors(html.parser.HTMLParser):
    """The links (href, src) and the anchors (id, name) of one HTML file.

    Links in Doxygen's summary bar of a class page ("Classes | Public Member Functions") are left
    out: Doxygen 1.9 links "Classes" there even when the only nested classes are private and have
    no section, which is Doxygen's, not the pages', problem."""

    def __init__(self):
        super().__init__()
        self.links, self.anchors = [], set()
        self.div_depth = 0
        self.summary_depth = None  # div depth of the open summary bar, if any

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div":
            self.div_depth += 1
            if attrs.get("class") == "summary" and self.summary_depth is None:
                self.summary_depth = self.div_depth
        for key in ("id", "name"):
            if attrs.get(key):
                self.anchors.add(attrs[key])
        if self.summary_depth is None:
            for key in ("href", "src"):
                if attrs.get(key):
                    self.links.append(attrs[key])

    def handle_endtag(self, tag):
        if tag == "div":
            if self.summary_depth == self.div_depth:
                self.summary_depth = None
            self.div_depth -= 1


def parse_html(path, cache):
    if path not in cache:
        parser = Anchors()
        with open(path, encoding="utf-8", errors="replace") as f:
            parser.feed(f.read())
        cache[path] = parser
    return cache[path]


def command_check_html(args):
    (html_dir,) = args
    cache, broken, checked = {}, [], 0
    for folder, _, files in os.walk(html_dir):
        for name in sorted(files):
            if not name.endswith(".html"):
                continue
            page = os.path.join(folder, name)
            for link in parse_html(page, cache).links:
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//", link):
                    continue  # http:, https:, mailto:, javascript:
                checked += 1
                path, _, fragment = html.unescape(link).partition("#")
                target = os.path.normpath(os.path.join(folder, path)) if path else page
                if not os.path.exists(target):
                    broken.append(f"{os.path.relpath(page, html_dir)}: {link} (no such file)")
                elif fragment and target.endswith(".html") and fragment not in parse_html(target, cache).anchors:
                    broken.append(f"{os.path.relpath(page, html_dir)}: {link} (no anchor #{fragment})")
    return report(broken, checked, f"HTML under {html_dir}")


def command_check_markdown(args):
    files = args
    if not files:
        listed = subprocess.run(["git", "-C", ROOT, "ls-files", "*.md"], capture_output=True, text=True,
                                check=True).stdout.split()
        files = [os.path.join(ROOT, f) for f in listed]
    broken, checked = [], 0
    for path in files:
        page = os.path.relpath(path, ROOT)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for index, m in links(text):
            target = m.group(3)
            if EXTERNAL.match(target):
                continue
            checked += 1
            resolved = resolve(page, target)
            if resolved is None:
                broken.append(f"{page}:{index + 1}: {target} (outside the repository)")
            elif not os.path.exists(os.path.join(ROOT, resolved[0])):
                broken.append(f"{page}:{index + 1}: {target} (no such file)")
    return report(broken, checked, "markdown links")


def report(broken, checked, what):
    for line in broken:
        print(f"broken link: {line}", file=sys.stderr)
    print(f"doc_links: {what}: {checked} relative links checked, {len(broken)} broken")
    return 1 if broken else 0


def main(argv):
    commands = {"filter": command_filter, "copy": command_copy, "check-html": command_check_html,
                "check-markdown": command_check_markdown}
    if len(argv) < 1 or argv[0] not in commands:
        sys.exit(__doc__)
    return commands[argv[0]](argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
