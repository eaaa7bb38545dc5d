"""The README and docs/: every relative link and #anchor points at a file and a heading that exist,
every `invoke` command shown is one invoke's own parser accepts for tasks.py, the README names
every invoke task and every `python -m train` command, the README's metrics.csv columns are the
ones the training writes, and an exit code quoted beside an error's name is the one train/errors.py gives it.

Fast and offline: links to other sites are not followed. Anchors follow GitHub's rule for heading
ids (lowercase; punctuation other than '-' and '_' dropped; each space becomes '-'; a repeated
heading gets -1, -2, ...), so a link that works here also works on GitHub.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import extra_present

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


# docs/history/ too: development.md and performance.md send a reader there, and it links back.
@pytest.mark.parametrize(
    "path",
    [*markdown_files(), *sorted((ROOT / "docs" / "history").glob("*.md"))],
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
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


# --- invoke commands ------------------------------------------------------------------------------

INVOKE = re.compile(r"(?<![\w-])invoke(?=\s|$)")
COMMAND_ENDS = {"&&", "||", "|", ";", "&", "/", ")"}


def _code(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every fenced code line and every inline code span (which may wrap)."""
    found, fenced, prose = [], False, []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:  # a shell line: the command, and in its comment only the code spans
            m = re.search(r"(?:^|\s)#", line)
            command, comment = (line[: m.start()], line[m.end() :]) if m else (line, "")
            found.append((number, command))
            found += [(number, span) for span in re.findall(r"`([^`]+)`", comment)]
        else:
            prose.append((number, line))
    joined = "\n".join(line for _, line in prose)
    starts = [number for number, _ in prose]
    for m in re.finditer(r"`([^`]+)`", joined):
        found.append((starts[joined.count("\n", 0, m.start())], m.group(1).replace("\n", " ")))
    return found


def invoke_commands(text: str) -> list[tuple[int, list[str]]]:
    """Every `invoke ...` command line shown in a markdown text: (line number, its arguments)."""
    import shlex

    commands = []
    for number, code in _code(text):
        for m in INVOKE.finditer(code):
            lexer = shlex.shlex(code[m.end() :], posix=True, punctuation_chars=";&|()")
            lexer.whitespace_split, lexer.commenters = True, "#"
            try:
                tokens = list(lexer)
            except ValueError:  # an unclosed quote: a code span cut in the middle of a string
                tokens = code[m.end() :].split()
            args = []
            for token in tokens:
                if token in COMMAND_ENDS:
                    break
                if "`" in token:  # the end of a code span inside a fenced line (a file tree, ...)
                    args += [token.split("`")[0]] if token.split("`")[0] else []
                    break
                args.append(token)
            commands.append((number, args))
    return commands


def invoke_errors(path: Path, root: Path = ROOT) -> list[str]:
    """Every invoke command of one markdown file that invoke's own parser refuses (unknown task or option)."""
    from invoke import Collection, Program
    from invoke.exceptions import ParseError
    from invoke.loader import FilesystemLoader
    from invoke.parser import Parser

    module, _ = FilesystemLoader(start=str(root)).load("tasks")
    contexts = Collection.from_module(module).to_contexts()
    initial = Program().initial_context  # the core flags: --list, --help, ...
    problems = []
    for number, args in invoke_commands(path.read_text(encoding="utf-8")):
        try:
            core = Parser(initial=initial, ignore_unknown=True).parse_argv(args)
            Parser(initial=initial, contexts=contexts).parse_argv(core.unparsed)
        except ParseError as exc:
            problems.append(f"{path.relative_to(root)}:{number}: invoke {' '.join(args)} ({exc})")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.name)
def test_every_invoke_command_in_the_docs_names_a_real_task_and_real_options(path):
    if not (ROOT / "tasks.py").is_file():
        pytest.skip("tasks.py is a host-side file (not in the image)")
    assert invoke_errors(path) == []


def test_the_invoke_checker_refuses_unknown_tasks_and_options_and_accepts_real_ones(tmp_path):
    (tmp_path / "tasks.py").write_text(
        "from invoke import task\n\n"
        "@task\ndef lock(c, upgrade=False, package=''):\n    pass\n\n"
        "@task\ndef serve(c, name, colour=True):\n    pass\n",
        encoding="utf-8",
    )
    doc = tmp_path / "README.md"
    doc.write_text(
        "Run `invoke lock --package numpy` or `invoke lock -u`, `invoke --list`, `invoke\nserve web --no-colour`.\n"
        "```\nFOO=1 invoke lock --upgrade && invoke serve web   # then `invoke lock --upgrade-package x`\n"
        "invoke lock / invoke publish\ninvoke serve web --no-upgrade\ninvoke lock   # invoke lock prints nothing\nfolder/  a tree (`invoke lock`)\n```\n"
        "invoke without backticks is prose: invoke anything --at-all.\n",
        encoding="utf-8",
    )
    errors = invoke_errors(doc, root=tmp_path)
    assert [e.split(" (")[0] for e in errors] == [
        "README.md:4: invoke lock --upgrade-package x",
        "README.md:5: invoke publish",
        "README.md:6: invoke serve web --no-upgrade",
    ]


# "`RunBusyError`, exit 4", "ExportError (exit 8)": a name, then "exit N" within the same clause.
QUOTED_EXIT = re.compile(r"\b([A-Z]\w+)\b`?[^.;`]{0,60}?\bexit (\d+)")


def wrong_exit_codes(text: str) -> list[str]:
    """Every "<error>, exit N" of a doc where train/errors.py gives that error another code."""
    from train import errors

    wrong = []
    for m in QUOTED_EXIT.finditer(text):
        error = getattr(errors, m[1], None)
        if isinstance(error, type) and issubclass(error, errors.TemplateError) and error.exit_code != int(m[2]):
            line = text.count("\n", 0, m.start()) + 1
            wrong.append(f"line {line}: {m[1]}, exit {m[2]} (train/errors.py: exit {error.exit_code})")
    return wrong


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.name)
def test_every_exit_code_quoted_beside_an_error_is_the_errors_own(path):
    assert wrong_exit_codes(path.read_text(encoding="utf-8")) == []


def test_the_exit_code_checker_finds_a_code_the_error_does_not_have():
    text = "`RunBusyError`, exit 4; `Mismatch` exit 3.\nthe file is gone: `ExportError` (exit 4)."
    assert wrong_exit_codes(text) == ["line 2: ExportError, exit 4 (train/errors.py: exit 8)"]


def test_the_readmes_metrics_csv_columns_are_the_ones_written():
    from train.run.metrics_files import METRIC_COLUMNS

    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("metrics.csv "))
    entry = [lines[start].split("metrics.csv", 1)[1]]
    for line in lines[start + 1 :]:  # the entry's continuation lines are indented past the names
        if not line.startswith(" " * 10):
            break
        entry.append(line)
    listed = " ".join(entry).split(":", 1)[1].split("(")[0]
    assert [c.strip() for c in listed.split(",")] == METRIC_COLUMNS


def test_the_readme_names_every_invoke_task_and_every_command():
    """A stranger learns the tasks and commands from the README: none may be missing from it."""
    from train.cli import COMMANDS

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = re.findall(r"^\| `python -m train (?:\[(\w+)\]|(\w+))", readme, flags=re.M)
    # The commands of the extras a fork deleted may stay in its README until it edits it.
    deleted = {command for command in ("serve", "sweep") if not extra_present(command)}
    assert sorted({a or b for a, b in table} - deleted) == sorted(COMMANDS)
    if not (ROOT / "tasks.py").is_file():
        pytest.skip("tasks.py is a host-side file (not in the image)")
    from invoke import Collection
    from invoke.loader import FilesystemLoader

    module, _ = FilesystemLoader(start=str(ROOT)).load("tasks")
    listed = re.search(r"`invoke --list` shows the tasks \(([^)]*)\)", readme).group(1)
    assert sorted(t.strip() for t in listed.split(",")) == sorted(Collection.from_module(module).task_names)
