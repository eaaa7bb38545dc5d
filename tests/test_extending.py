"""docs/extending.md: every code block is applied, as written, to a copy of the project, which then
takes the new model, data set, setting and GPU diagnosis (settings check, the diagnosis' own test,
and a tiny training run that downloads the data set from a local HTTP server)."""

from __future__ import annotations

import io
import json
import pickle
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers import PROJECT_ROOT, LocalFiles, subprocess_env, write_generated_settings_files

DOC = PROJECT_ROOT / "docs" / "extending.md"
_WHERE = re.compile(
    r"^# (?P<path>\S+): (?:(?P<end>add at the end)|(?P<how>add after|add before|replace) the line "
    r'starting with "(?P<anchor>.+)")$'
)
CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"


@dataclass
class Block:
    section: str
    path: str
    how: str  # "add at the end" | "add after" | "add before" | "replace"
    anchor: str | None
    code: str


def doc_blocks(text: str) -> list[Block]:
    out, section = [], ""
    for m in re.finditer(r"^## ([^\n]+)$|^```python\n(.*?)^```$", text, re.M | re.S):
        if m.group(1):
            section = m.group(1)
            continue
        first, _, code = m.group(2).partition("\n")
        where = _WHERE.match(first)
        assert where, f"a python block in {DOC.name} ({section}) does not say where it goes: {first!r}"
        out.append(Block(section, where["path"], where["end"] or where["how"], where["anchor"], code.rstrip("\n")))
    return out


def apply(root: Path, block: Block) -> None:
    """Put the block into its file where its first line says; the anchor must name exactly one line."""
    path = root / block.path
    lines = path.read_text().splitlines()
    if block.anchor is None:
        lines += ["", "", *block.code.splitlines()]
    else:
        hits = [i for i, line in enumerate(lines) if line.strip().startswith(block.anchor)]
        assert len(hits) == 1, f"{block.path}: {len(hits)} lines start with {block.anchor!r} (expected one)"
        i, new = hits[0], block.code.splitlines()
        if block.how == "add before" and not lines[i].startswith(" "):
            new += ["", ""]  # a top-level definition: two blank lines before the next one
        start = i + 1 if block.how == "add after" else i
        lines[start : i + 1 if block.how == "replace" else start] = new
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fork")
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache")
    for part in ("train", "tests"):
        shutil.copytree(PROJECT_ROOT / part, root / part, ignore=ignore)
    for name in ("pyproject.toml", "tasks.py", "README.md", ".env.example"):  # the last two list every setting
        shutil.copy(PROJECT_ROOT / name, root)
    for block in doc_blocks(DOC.read_text()):
        apply(root, block)
    return root


def run(project: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=project,
        capture_output=True,
        text=True,
        env=subprocess_env(PYTHONPATH=str(project), **(env or {})),
    )


def test_each_kind_of_extension_has_an_example_that_says_where_it_goes():
    blocks = doc_blocks(DOC.read_text())
    assert {b.section for b in blocks} == {"Add a model", "Add a data set", "Add a setting", "Add a GPU diagnosis"}
    assert {b.path for b in blocks} >= {
        "train/models.py",
        "train/datasets.py",
        "train/config.py",
        "tests/gpucheck/test_diagnose.py",
    }


def test_an_anchor_must_name_one_line(tmp_path):
    (tmp_path / "m.py").write_text("a = 1\na = 2\n")
    with pytest.raises(AssertionError, match="2 lines start with 'a ='"):
        apply(tmp_path, Block("", "m.py", "replace", "a =", "a = 3"))
    apply(tmp_path, Block("", "m.py", "add after", "a = 2", "b = 3"))
    assert (tmp_path / "m.py").read_text() == "a = 1\na = 2\nb = 3\n"


def test_the_new_model_data_set_and_setting_are_checked_settings(project):
    env = {"MODEL": "mlp", "DATASET": "cifar100", "WEIGHT_DECAY": "0.01", "MONITOR": "val_top2"}
    proc = run(project, "-m", "train", "settings", env=env)
    assert proc.returncode == 0, proc.stderr
    for line in ("MODEL=mlp", "DATASET=cifar100", "WEIGHT_DECAY=0.01", "MONITOR=val_top2"):
        assert line in proc.stdout.splitlines()
    bad = run(project, "-m", "train", "settings", env={**env, "WEIGHT_DECAY": "2"})
    assert bad.returncode == 2
    assert bad.stderr.strip() == "ConfigError: WEIGHT_DECAY=2.0 is not valid: must be between 0.0 and 1.0"
    table = run(project, "-m", "train", "settings", "--format", "table").stdout
    assert "mlp (two dense layers, a baseline)" in table and "cifar100" in table
    assert "| `WEIGHT_DECAY` | `--weight-decay` | `0.0` | AdamW weight decay (0: none) |" in table


def test_a_section_whose_example_changes_the_settings_files_says_how_to_regenerate_them(tmp_path):
    """A reader follows one section alone: where its example changes what `settings` prints (a name in
    MODEL's or DATASET's help, a new setting), the committed .env.example and README table go stale and
    tests/test_config.py fails, so that section itself names the command that rewrites them."""
    text = DOC.read_text()
    sections = {m[1]: m[2] for m in re.finditer(r"^## ([^\n]+)\n(.*?)(?=^## |\Z)", text, re.M | re.S)}
    committed, blocks = (PROJECT_ROOT / ".env.example").read_text(), doc_blocks(text)
    changed = []
    for section in sorted({b.section for b in blocks}):
        fork = tmp_path / re.sub(r"\W+", "-", section)
        shutil.copytree(PROJECT_ROOT / "train", fork / "train", ignore=shutil.ignore_patterns("__pycache__"))
        for block in blocks:
            if block.section == section and block.path.startswith("train/"):
                apply(fork, block)
        proc = run(fork, "-m", "train", "settings", "--format", "env-example")
        assert proc.returncode == 0, proc.stderr
        if proc.stdout != committed:
            changed.append(section)
            assert "invoke settings-files" in sections[section], (
                f"docs/extending.md, {section}: its example changes .env.example, and the section does not say "
                "to run `invoke settings-files`"
            )
    assert {"Add a model", "Add a data set", "Add a setting"} <= set(changed)


def test_no_other_test_names_a_model_data_set_or_setting_the_examples_add():
    """A fork that follows the examples has `mlp`, `cifar100` and WEIGHT_DECAY: a test that takes one of
    those names for one the template lacks (refused as unknown, or registered a second time) fails
    there, against the doc's word that only the two generated files change."""
    text = DOC.read_text()
    fields = re.findall(r"^    (\w+): \w+ = _f\(", text, re.M)
    names = {*re.findall(r'register\("(\w+)"', text), *re.findall(r'Dataset\("(\w+)"', text), *fields}
    names |= {name.upper() for name in fields}
    assert {"mlp", "cifar100", "weight_decay", "WEIGHT_DECAY"} <= names
    alternatives = "|".join(sorted(names))
    quoted = re.compile(rf"""["']({alternatives})["']""")
    found = [
        f"{path.relative_to(PROJECT_ROOT)}: {m[1]!r}"
        for path in sorted((PROJECT_ROOT / "tests").rglob("*.py"))
        if path.name != Path(__file__).name
        for m in quoted.finditer(path.read_text())
    ]
    assert not found, f"tests that a fork following docs/extending.md breaks (use another name): {found}"


@pytest.mark.slow
def test_after_the_regeneration_the_doc_asks_for_the_settings_tests_pass_in_the_fork(project):
    """The new model, data set and setting touch no test: only the two generated files change."""
    assert re.search(r"^\$ invoke settings-files$", DOC.read_text(), re.M), (
        "docs/extending.md no longer says how to regenerate .env.example"
    )
    write_generated_settings_files(project)
    proc = run(project, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", "tests/test_config.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_diagnosis_example_passes_its_own_test(project):
    proc = run(
        project,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/gpucheck/test_diagnose.py",
        "-k",
        "mixed_gpu_models",
    )
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr


def cifar100_archive(path: Path) -> Path:
    """A small archive in the publisher's layout: 200 training images (every class), 100 test images."""
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tar:
        for member, n in (("train", 200), ("test", 100)):
            blob = pickle.dumps(
                {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"fine_labels": [i % 100 for i in range(n)]}
            )
            info = tarfile.TarInfo(f"cifar-100-python/{member}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path


# The example's loader runs unchanged; only the address it asks for is answered from the local server.
_FIT = """
import sys
from pathlib import Path

from train import cli, datasets

url, local, digest = sys.argv[1:4]
real_download = datasets.download


def local_download(asked, file_hash, cache_dir, subdir="datasets"):
    assert asked == url, asked
    return real_download(local, digest, cache_dir, subdir)


datasets.download = local_download
sys.exit(cli.main(["fit", *sys.argv[4:]]))
"""


@pytest.mark.slow
def test_a_tiny_run_downloads_the_new_data_set_and_trains_the_new_model_with_the_new_setting(project, tmp_path):
    import hashlib

    site = tmp_path / "site"
    site.mkdir()
    archive = cifar100_archive(site / "cifar-100-python.tar.gz")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    runs = tmp_path / "runs"
    with LocalFiles(site) as files:
        proc = run(
            project,
            "-c",
            _FIT,
            CIFAR100_URL,
            files.url(archive.name),
            digest,
            "--model",
            "mlp",
            "--dataset",
            "cifar100",
            "--weight-decay",
            "0.01",
            "--monitor",
            "val_top2",
            "--epochs",
            "1",
            "--batch-size",
            "50",
            "--val-split",  # the served archive holds a handful of images per class
            "0.5",
            "--report",
            "off",
            "--peak-flops",  # given, as helpers.tiny_values does: not measured in a fresh RUNS_DIR
            "1e12",
            "--precision",
            "float32",
            "--progress",
            "line",
            "--runs-dir",
            str(runs),
            "--data-dir",
            str(tmp_path / "data"),
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert files.requests == ["/cifar-100-python.tar.gz"]
    (run_dir,) = [p for p in runs.iterdir() if not p.name.startswith(".")]
    header = (run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[:6] == ["epoch", "loss", "accuracy", "top2", "val_loss", "val_accuracy"] and "val_top2" in header
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["model"], config["dataset"], config["weight_decay"]) == ("mlp", "cifar100", 0.01)
    labels = (run_dir / "labels.txt").read_text().split()
    assert len(labels) == 100 and labels[0] == "apple" and labels[-1] == "worm"
    assert (tmp_path / "data" / "keras" / "datasets" / "cifar-100-python.tar.gz").is_file()
    assert (run_dir / "export" / "labels.txt").read_text().split() == labels  # the model with top2 exports
