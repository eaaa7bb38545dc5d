"""The pieces every HTML page of the package is made of: one style sheet, escaped text, tables,
notes and embedded PNG pictures (the run report, `compare --html` and the sweep's study report).

Self-contained pages: no scripts, no files beside them, so a report can be mailed or uploaded as it is.
"""

from __future__ import annotations

import base64
import html

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 6px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.status{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-size:14px;vertical-align:middle}
.completed{background:#2e7d32}.running{background:#1565c0}.interrupted,.budget{background:#ef6c00}.failed{background:#b00020}
.unknown{background:#757575} .pruned{background:#6d4c41} .lead{font-size:15px;margin:6px 0} .error{background:#fdecea;border:1px solid #b00020;padding:8px 12px}
.note{color:#555;font-style:italic} img{max-width:100%;height:auto;display:block;margin:8px 0}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums} code{font-size:12px}
"""


def table(rows, header: tuple[str, ...] | None = None) -> str:
    head = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>" if header else ""
    cells = "".join(
        "<tr>" + "".join(c + "</td>" if c.startswith("<td") else f"<td>{c}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table>{head}{cells}</table>"


def img(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def note(text: str) -> str:
    return f'<p class="note">{escape(text)}</p>'


def escape(value) -> str:
    """`value` as HTML text; a lone surrogate (a path that was no UTF-8, kept in JSON as \\udcff) as ?: the
    page is written as UTF-8, which has no such character."""
    return html.escape(str(value).encode("utf-8", "replace").decode("utf-8"))


def num(v) -> str:
    return "" if v is None else (f"{v:.0f}" if float(v).is_integer() and abs(v) < 1e9 else f"{v:.4g}")
