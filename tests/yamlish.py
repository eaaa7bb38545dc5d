"""A small reader for the block YAML of this repository's compose and Kubernetes files (no PyYAML here).

Enough for what those files use: block mappings and sequences, `- key: value` items, plain,
quoted and flow-list scalars, `{a: b}` flow mappings, comments, `---` documents, and compose's
`&anchor` / `<<: *anchor` merge. Anything else raises ValueError, so a test never passes on a file
it did not really read.
"""

from __future__ import annotations

import json
import re


def load_all(text: str) -> list:
    docs, current = [], []
    for line in text.splitlines():
        if line.strip() == "---":
            docs.append(current)
            current = []
        else:
            current.append(line)
    docs.append(current)
    return [d for d in (_Reader(lines).document() for lines in docs) if d is not None]


def load(text: str):
    docs = load_all(text)
    if len(docs) != 1:
        raise ValueError(f"expected one document, found {len(docs)}")
    return docs[0]


def _strip_comment(line: str) -> str:
    out, quote = [], None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            break
        out.append(ch)
    return "".join(out).rstrip()


def _scalar(text: str, anchors: dict):
    t = text.strip()
    if t.startswith("*"):
        return anchors[t[1:]]
    if t.startswith('"'):
        return json.loads(t)
    if t.startswith("'"):
        return t[1:-1].replace("''", "'")
    if t.startswith("["):
        return [_scalar(x, anchors) for x in _split_flow(t[1:-1])]
    if t.startswith("{"):
        return dict(_pair(x, anchors) for x in _split_flow(t[1:-1]))
    if t in ("true", "false"):
        return t == "true"
    if t in ("null", "~", ""):
        return None
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    if t.startswith(("&", "!", "|", ">")):
        raise ValueError(f"unsupported YAML: {t!r}")
    return t


def _split_flow(body: str) -> list[str]:
    parts, depth, quote, cur = [], 0, None, ""
    for ch in body:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts]


def _pair(text: str, anchors: dict):
    key, _, value = text.partition(":")
    return key.strip(), _scalar(value, anchors)


class _Reader:
    def __init__(self, lines: list[str]):
        self.lines = [(len(s) - len(s.lstrip(" ")), s.strip()) for s in map(_strip_comment, lines) if s.strip()]
        self.i = 0
        self.anchors: dict = {}

    def document(self):
        if not self.lines:
            return None
        value = self.block(self.lines[0][0])
        if self.i != len(self.lines):
            raise ValueError(f"unexpected indentation at: {self.lines[self.i][1]!r}")
        return value

    def block(self, indent: int):
        return self.sequence(indent) if self.lines[self.i][1].startswith("- ") else self.mapping(indent)

    def mapping(self, indent: int, into: dict | None = None) -> dict:
        out = {} if into is None else into
        while (
            self.i < len(self.lines) and self.lines[self.i][0] == indent and not self.lines[self.i][1].startswith("- ")
        ):
            text = self.lines[self.i][1]
            m = re.match(r'^("[^"]*"|[^:]+?):(?:\s+(.*))?$', text)
            if not m:
                raise ValueError(f"not a mapping entry: {text!r}")
            key, rest = m.group(1).strip('"'), (m.group(2) or "").strip()
            self.i += 1
            anchor = None
            if rest.startswith("&"):
                anchor, _, rest = rest[1:].partition(" ")
                rest = rest.strip()
            if rest:
                value = _scalar(rest, self.anchors)
            elif self.i < len(self.lines) and (
                self.lines[self.i][0] > indent
                or (self.lines[self.i][0] == indent and self.lines[self.i][1].startswith("- "))
            ):
                value = self.block(self.lines[self.i][0])
            else:
                value = None
            if anchor:
                self.anchors[anchor] = value
            if key == "<<":
                for k, v in value.items():
                    out.setdefault(k, v)
            else:
                out[key] = value
        return out

    def sequence(self, indent: int) -> list:
        out = []
        while self.i < len(self.lines) and self.lines[self.i][0] == indent and self.lines[self.i][1].startswith("- "):
            text = self.lines[self.i][1][2:].strip()
            if re.match(r'^("[^"]*"|[\w.-]+):(\s|$)', text):
                # "- key: value" opens a mapping whose other keys sit two columns deeper
                self.lines[self.i] = (indent + 2, text)
                out.append(self.mapping(indent + 2))
            else:
                self.i += 1
                out.append(_scalar(text, self.anchors))
        return out
