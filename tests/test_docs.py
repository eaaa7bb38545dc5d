"""The README and docs/: every relative link and #anchor points at a file and a heading that exist.

Fast and offline: links to other sites are not followed. Anchors follow GitHub's rule for heading
ids (lowercase; punctuation other than '-' and '_' dropped; each space becomes '-'; a repeated
heading gets -1, -2, ...), so a link that works here also works on GitHub.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def markdown_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link or a heading inside a code block is just text)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        lines.append("" if fenced else line)
    return lines


def slug(heading: str) -> str:
    """GitHub's id for a heading: `## JSON fields (`--json`)` -> `json-fields---json`."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in _prose(path.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of one markdown file that does not resolve, as 'file:line: target (why)'."""
    problems = []
    for number, line in enumerate(_prose(path.read_text(encoding="utf-8")), start=1):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{number}"
            if not dest.exists():
                problems.append(f"{where}: {target} (no such file)")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                problems.append(f"{where}: {target} (no heading with that anchor in {dest.name})")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(path):
    assert broken_links(path) == []


def test_every_doc_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in markdown_files()[1:] if f"](docs/{p.name})" not in readme]
    assert unlinked == []


def test_slug_follows_githubs_rule():
    assert slug("Checking the GPU: `python -m train check`") == "checking-the-gpu-python--m-train-check"
    assert slug("JSON fields (`--json`)") == "json-fields---json"
    assert slug("Behind a TLS-intercepting (corporate) proxy") == "behind-a-tls-intercepting-corporate-proxy"
    assert slug("`.env`, the environment and flags") == "env-the-environment-and-flags"


def test_the_checker_finds_a_missing_file_a_missing_anchor_and_ignores_code(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Exit codes\n\n## Exit codes\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# T\n\n## Container\n\n"
        "[ok](docs/a.md) [ok](docs/a.md#exit-codes) [ok](docs/a.md#exit-codes-1) [ok](#container)\n"
        "[web](https://example.org/x#y) `[code](nowhere.md)`\n"
        "[gone](docs/b.md) [moved](#development) [wrong](docs/a.md#container)\n"
        "```\n[in a block](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(readme, root=tmp_path) == [
        "README.md:7: docs/b.md (no such file)",
        "README.md:7: #development (no heading with that anchor in README.md)",
        "README.md:7: docs/a.md#container (no heading with that anchor in a.md)",
    ]


def invoke_options(text: str) -> list[tuple[int, str, str]]:
    """(line, task, --option) of every `invoke TASK ... --option` written in `text`, code blocks included.

    A command ends at a backtick, a comment, `&&`, `|` or `;`; quoted arguments (`--args "--epochs 5"`)
    are the task's value, not its options."""
    import shlex

    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for m in re.finditer(r"\binvoke ([a-z][a-z-]*)((?:[^`#&|;]|&(?!&))*)", line):
            try:
                words = shlex.split(m.group(2))
            except ValueError:  # an unclosed quote: a line cut in the middle of a command
                words = m.group(2).split()
            # A word with a space in it was quoted: a value (`--args "--epochs 5"`), not an option.
            found += [(number, m.group(1), w.split("=")[0]) for w in words if w.startswith("--") and " " not in w]
    return found


def test_every_invoke_option_in_the_docs_is_one_the_task_has():
    import inspect
    import sys

    sys.path.insert(0, str(ROOT))
    try:
        import tasks
    finally:
        sys.path.remove(str(ROOT))
    problems = []
    for path in markdown_files():
        for number, name, option in invoke_options(path.read_text(encoding="utf-8")):
            if name not in tasks.ns.task_names:
                problems.append(f"{path.relative_to(ROOT)}:{number}: invoke {name} (no such task)")
                continue
            # From the task's signature: Task.get_arguments() uses up the help texts it reads.
            params = list(inspect.signature(tasks.ns[name].body).parameters)[1:]  # after the context
            names = {"--" + n.replace("_", "-") for n in params}
            names |= {"--no-" + n[2:] for n in names} | {"--help"}
            if option not in names:
                problems.append(f"{path.relative_to(ROOT)}:{number}: invoke {name} {option} (no such option)")
    assert not problems, problems


def test_the_invoke_checker_reads_commands_in_prose_and_code():
    text = 'see `invoke lock --upgrade-package numpy` or\ninvoke train --args "--epochs 5" --cpu  # --not-this\n'
    assert invoke_options(text) == [(1, "lock", "--upgrade-package"), (2, "train", "--args"), (2, "train", "--cpu")]
