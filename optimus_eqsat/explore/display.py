"""Offline rich displays: DOT rendered to SVG by the ``dot`` binary, HTML fallbacks.

Nothing here loads JavaScript or touches the network. When Graphviz's ``dot``
is not on PATH (or fails), pictures fall back to an HTML table built by the
caller, so notebooks still run.
"""

from __future__ import annotations

import html
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

DOT_TIMEOUT_S = 60.0


def dot_binary() -> str | None:
    """Path of Graphviz's ``dot``, or None."""
    return shutil.which("dot")


def render_svg(dot_source: str, timeout: float = DOT_TIMEOUT_S) -> str | None:
    """``dot -Tsvg``; None when the binary is missing or fails."""
    binary = dot_binary()
    if binary is None:
        return None
    try:
        done = subprocess.run([binary, "-Tsvg"], input=dot_source.encode(), capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    svg = done.stdout.decode()
    start = svg.find("<svg")  # drop the XML prolog and DOCTYPE: the SVG is inlined in HTML
    return svg[start:] if start >= 0 else None


def quote(text: object) -> str:
    """A DOT double-quoted string."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def esc(text: object) -> str:
    return html.escape(str(text))


@dataclass
class Picture:
    """A graph picture: DOT source, its SVG (None without Graphviz) and an HTML fallback.

    Displays as SVG in a notebook; ``save("x.svg")`` writes the SVG (or the
    HTML fallback to ``x.html``). ``info`` says what was left out, if anything.
    """

    dot: str
    fallback_html: str
    title: str = ""
    info: str = ""
    _svg: str | None = None
    _rendered: bool = False

    @property
    def svg(self) -> str | None:
        if not self._rendered:
            self._svg, self._rendered = render_svg(self.dot), True
        return self._svg

    def _repr_svg_(self) -> str | None:
        return self.svg

    def __repr__(self) -> str:
        kind = "svg" if self.svg is not None else "html fallback"
        return f"<Picture {self.title!r} ({kind}; {self.info or 'complete'})>"

    def _repr_html_(self) -> str:
        head = f"<div><b>{esc(self.title)}</b></div>" if self.title else ""
        note = f"<div style='color:#666;font-size:90%'>{esc(self.info)}</div>" if self.info else ""
        body = self.svg if self.svg is not None else self.fallback_html
        return f"<div style='overflow:auto'>{head}{note}{body}</div>"

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        if self.svg is not None:
            path.write_text(self.svg)
            return path
        out = path.with_suffix(".html")
        out.write_text(self._repr_html_())
        return out


@dataclass
class SideBySide:
    """Several HTML-displayable things in one row (pictures, code, tables)."""

    items: list
    titles: list[str]

    def __repr__(self) -> str:
        return f"<SideBySide {' | '.join(self.titles)}>"

    def _repr_html_(self) -> str:
        cells = []
        for item, title in zip(self.items, self.titles):
            body = item._repr_html_() if hasattr(item, "_repr_html_") else f"<pre>{esc(item)}</pre>"
            cells.append(f"<div style='flex:1;min-width:0;overflow:auto;padding:4px'><h4>{esc(title)}</h4>{body}</div>")
        return f"<div style='display:flex;gap:8px;align-items:flex-start'>{''.join(cells)}</div>"


@dataclass
class Code:
    """Python source that displays as a preformatted block."""

    text: str

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<pre style='font-size:80%;white-space:pre'>{esc(self.text)}</pre>"


def html_table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
