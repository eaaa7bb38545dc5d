"""train.extras: a setting or command that needs an extra that is not installed is refused in one
line naming the command that adds it, before TensorFlow is imported. "Not installed" is made real by
a None in sys.modules, which is what an import of a missing package finds. And an extra with a folder
of its own is deleted by removing that folder and its one line in train/extras.py (in a copy here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from helpers import (
    EXTRA_SKIP,
    clone_of_the_package,
    each_extra,
    subprocess_env,
    tiny_values,
    train_in,
    write_generated_settings_files,
    write_tiny_npz,
)

from train import extras
from train.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# The extras that bring modules into the training environment (a tool's extra brings none).
PACKAGES = {name: extra.modules for name, extra in extras.EXTRAS.items() if extra.modules}


def test_every_extra_has_its_requirements_file_and_names_the_modules_it_brings():
    for extra, modules in PACKAGES.items():
        listed = (PROJECT_ROOT / "requirements" / f"{extra}.in").read_text().lower()
        assert modules and (PROJECT_ROOT / "requirements" / f"{extra}.lock").is_file()
        assert f"-r {extra}.in" in (PROJECT_ROOT / "requirements" / "all.in").read_text()
        # a module is its distribution's name or its top level (mlflow-skinny -> mlflow, tf2onnx brings onnx)
        assert any(m in listed for m in modules), (extra, modules)


@pytest.mark.parametrize("extra", each_extra(sorted(name for name, e in extras.EXTRAS.items() if e.tool)))
def test_an_extra_that_runs_a_tool_has_an_environment_of_its_own_that_ci_builds(extra):
    """DVC and the like: requirements/<extra>.in and .lock, scripts/venv-<extra>.sh making .venv-<extra>; never
    in all.in (nor, so, in any lock of the training environment or the image)."""
    assert extras.EXTRAS[extra].modules == ()
    assert (PROJECT_ROOT / "requirements" / f"{extra}.lock").is_file()
    assert f"-r {extra}.in" not in (PROJECT_ROOT / "requirements" / "all.in").read_text()
    script = (PROJECT_ROOT / "scripts" / f"venv-{extra}.sh").read_text()
    assert f"requirements/{extra}.lock .venv-{extra}" in script
    assert f"background venv-{extra} scripts/venv-{extra}.sh" in (PROJECT_ROOT / ".ci" / "run").read_text()
    assert f".venv-{extra}" in (PROJECT_ROOT / ".gitignore").read_text().split()


@pytest.mark.parametrize("extra", each_extra(sorted(PACKAGES)))
def test_a_missing_extra_is_refused_naming_it_and_the_command_that_adds_it(monkeypatch, extra):
    extras.require(extra, "SETTING", "value")  # the test environment has every extra
    module = PACKAGES[extra][-1]
    monkeypatch.setitem(sys.modules, module, None)
    assert extras.missing(extra) == [module]
    with pytest.raises(ConfigError) as info:
        extras.require(extra, "SETTING", "value")
    message = str(info.value)
    assert message.startswith(f"SETTING='value' is not valid: needs the {extra} extra ({module} is not installed")
    assert f"`scripts/venv.sh --extra {extra}`" in message and f"-r requirements/{extra}.lock" in message
    assert "\n" not in message


@pytest.mark.extra("mlflow", "onnx")
def test_training_asks_for_mlflow_only_with_a_tracking_uri_and_for_onnx_only_when_exported(monkeypatch):
    from train.config import Settings

    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "tf2onnx", None)
    extras.require_for_training(Settings())  # neither asked for
    with pytest.raises(ConfigError, match=r"^MLFLOW_TRACKING_URI='http://\*\*\*@127.0.0.1:5000' .* mlflow extra"):
        extras.require_for_training(Settings(mlflow_tracking_uri="http://u:secret@127.0.0.1:5000"))
    with pytest.raises(ConfigError, match=r"^EXPORT_FORMATS='savedmodel,ONNX' .* onnx extra"):
        extras.require_for_training(Settings(export_formats="savedmodel,ONNX"))


# The commands, in a fresh process: refused with exit 2 and one line, and TensorFlow never imported.
CHILD = """
import json, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
from train.cli import main
code = main(sys.argv[2:])
print(json.dumps({"code": code, "tensorflow": "tensorflow" in sys.modules}))
"""


@pytest.mark.parametrize(
    ("blocked", "args", "said"),
    [
        pytest.param(
            "obstore",
            ["fit", "--runs-dir", "s3://bucket/runs"],
            "RUNS_DIR='s3://bucket/runs' is not valid: needs the store",
            marks=pytest.mark.extra("store"),
        ),
        pytest.param(
            "obstore",
            ["runs", "--runs-dir", "s3://bucket/runs"],
            "needs the store extra",
            marks=pytest.mark.extra("store"),
        ),
        pytest.param(
            "mlflow",
            ["fit", "--mlflow-tracking-uri", "http://127.0.0.1:5000"],
            "needs the mlflow extra",
            marks=pytest.mark.extra("mlflow"),
        ),
        pytest.param(
            "tf2onnx",
            ["fit", "--export-formats", "onnx"],
            "EXPORT_FORMATS='onnx' is not valid: needs the onnx extra",
            marks=pytest.mark.extra("onnx"),
        ),
        pytest.param(
            "tf2onnx",
            ["export", "latest", "--format", "savedmodel,onnx"],
            "needs the onnx extra",
            marks=pytest.mark.extra("onnx"),
        ),
        pytest.param(
            "optuna",
            ["sweep", "space.toml"],
            "sweep='space.toml' is not valid: needs the sweep extra (optuna",
            marks=pytest.mark.extra("sweep"),
        ),
    ],
)
def test_each_command_refuses_a_missing_extra_before_tensorflow(tmp_path, blocked, args, said):
    done = subprocess.run(
        [sys.executable, "-c", CHILD, blocked, *args, "--env-file", ""],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT), "RUNS_DIR": str(tmp_path / "runs")},
        timeout=120,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"code": 2, "tensorflow": False}, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert said in line and "scripts/venv.sh --extra" in line


# -- deleting an extra: its folder and its one line in train/extras.py, in a copy of the package --------
AFTER_DELETION = """
import argparse, dataclasses, json
from train import cli, config, extras
commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
config.validate(config.Settings())
print(json.dumps({
    "extras": sorted(extras.EXTRAS),
    "commands": sorted(commands),
    "fields": sorted(f.name for f in dataclasses.fields(config.Settings)),
    "generated": config.env_example() + config.settings_table(),
}))
"""


def _delete_extras(copy: Path, names: list[str]) -> None:
    """Remove each extra's folder and its registration line, as a fork would."""
    registry = copy / "train" / "extras.py"
    lines = registry.read_text().splitlines(keepends=True)
    for name in names:
        shutil.rmtree(copy / extras.EXTRAS[name].package.replace(".", "/"))
        (line,) = [text for text in lines if text.lstrip().startswith(f'"{name}": Extra(')]
        lines.remove(line)
    registry.write_text("".join(lines))


WITH_FOLDERS = sorted(name for name, extra in extras.EXTRAS.items() if extra.package)
OWN_TEST_FOLDERS = {extras.EXTRAS[name].package.rpartition(".")[2] for name in WITH_FOLDERS}  # tests/<folder>/


def _settings_of(extra: str) -> list[str]:
    """The settings the extra declares (its section's fields), by field name."""
    return sorted(f.name for f in fields(extras.sections_by_name()[extra].Section))


@pytest.mark.parametrize("extra", each_extra(WITH_FOLDERS))
def test_deleting_an_extra_leaves_no_setting_command_or_generated_line_of_it(tmp_path, extra):
    from train.config import Settings

    copy = clone_of_the_package(tmp_path / "copy")
    _delete_extras(copy, [extra])
    done = subprocess.run(
        [sys.executable, "-c", AFTER_DELETION],
        cwd=copy,
        capture_output=True,
        text=True,
        env=subprocess_env(PYTHONPATH=str(copy)),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    after = json.loads(done.stdout)
    own = _settings_of(extra)
    assert own, f"the {extra} extra declares no setting"
    assert extra not in after["extras"] and extra not in after["commands"]
    gone = {f.name for f in fields(Settings)} - set(after["fields"])
    assert sorted(gone) == own  # its settings, and only its
    assert not [name for name in own if name.upper() in after["generated"]]
    assert f"the {extra} extra" not in after["generated"]


@pytest.mark.slow
def test_a_template_without_any_extra_folder_trains(tmp_path):
    copy = clone_of_the_package(tmp_path / "copy")
    _delete_extras(copy, WITH_FOLDERS)
    from train.config import as_flags

    values = tiny_values(tmp_path, write_tiny_npz(tmp_path)) | {"epochs": 1, "export": True}
    train_in(copy, "fit", *as_flags(values))
    (run,) = (tmp_path / "runs").glob("*/manifest.json")
    assert json.loads(run.read_text())["status"] == "completed"
    # Without the formats extra an export is the SavedModel, the .keras file and the labels.
    assert sorted(p.name for p in (run.parent / "export").iterdir()) == [
        "labels.txt",
        "model.keras",
        "parity.json",
        "savedmodel",
        "source.json",
    ]


# -- a fork without every extra: the tests that name one, and the generated files and docs ----------
def _names_of(extra: str) -> set[str]:
    """What a test that uses the extra mentions: its settings (ENV_NAME, and field_name when that is
    not a plain word), its package, and its command."""
    own = _settings_of(extra)
    names = {field.upper() for field in own} | {field for field in own if "_" in field}
    command = {f'"{extra}"'} if extra in extras.commands() else set()
    return names | {extras.EXTRAS[extra].package} | command


def _tests_naming_an_extra(root: Path) -> list[str]:
    """The test functions outside the extras' own folders whose code names an extra (node ids)."""
    import ast
    import re

    words = sorted(set().union(*(_names_of(name) for name in WITH_FOLDERS)) - {""})
    mention = re.compile(r"(?<![\w.])(" + "|".join(re.escape(w) for w in words) + r")(?!\w)")
    found = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        relative = path.relative_to(root)
        if relative.parts[1] in OWN_TEST_FOLDERS:
            continue
        source = path.read_text()
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                code = "\n".join(ast.get_source_segment(source, d) for d in node.decorator_list)
                if mention.search(code + ast.get_source_segment(source, node)):
                    found.append(f"{relative.as_posix()}::{node.name}")
    return found


# The fork's pytest plugin (-p fork_select): every collected id to FORK_COLLECTED, then only the
# tests of FORK_SELECT kept (a file, or a test function with all its parameters).
_FORK_SELECT = """
import json, os
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    with open(os.environ["FORK_COLLECTED"], "w") as f:
        json.dump([item.nodeid for item in items], f)
    chosen = set(json.loads(os.environ["FORK_SELECT"]))
    keep, drop = [], []
    for item in items:
        picked = item.nodeid.split("::")[0] in chosen or item.nodeid.split("[")[0] in chosen
        (keep if picked else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
"""


@pytest.mark.slow
def test_a_fork_without_every_extra_collects_and_passes_the_tests_that_name_one(tmp_path):
    """Each extra's folder and line deleted at once, as a fork would (its tests' folder left in place:
    it is not collected). Collected whole; then the fast tests that name an extra, with those of the
    generated files, the docs and the layers, run there under REQUIRE_ALL=1."""
    if not WITH_FOLDERS:
        pytest.skip(f"no extra with a folder {EXTRA_SKIP}")

    copy = tmp_path / "fork"
    # The whole template, but what runs and installs leave in it.
    left = ("__pycache__", ".git", ".venv*", "runs", "data", "mutants", ".benchmarks", ".pytest_cache", ".env")
    shutil.copytree(PROJECT_ROOT, copy, ignore=shutil.ignore_patterns(*left), symlinks=True)
    for launcher in ("deploy/k8s/tfjob.yaml", "deploy/k8s/trainjob.yaml", "deploy/k8s/indexed-job.yaml"):
        (copy / launcher).unlink(missing_ok=True)  # the workers extra's, deleted with it (docs/distributed.md)
    (copy / "docker-compose.multiworker.yml").unlink(missing_ok=True)
    _delete_extras(copy, WITH_FOLDERS)
    write_generated_settings_files(copy)
    chosen = _tests_naming_an_extra(PROJECT_ROOT)
    # (the scan finds what names a setting: SWEEP_STORAGE here, in a template that has the sweep extra)
    assert (
        "sweep" not in extras.EXTRAS
        or "tests/run/test_resume.py::test_a_resume_keeps_the_url_values_it_was_given_and_a_local_runs_dir_with_an_at"
        in chosen
    )
    files = ["tests/test_config.py", "tests/test_docs.py", "tests/test_extras.py", "tests/test_layers.py"]
    # One pytest in the fork: it collects the whole suite (a collection error fails it), writes every id
    # collected, then runs only the chosen tests (one start and one collection instead of two).
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "fork_select.py").write_text(_FORK_SELECT)
    collected = tmp_path / "collected.json"
    env = subprocess_env(
        PYTHONPATH=f"{copy}{os.pathsep}{plugin}",
        REQUIRE_ALL="1",
        FORK_SELECT=json.dumps([*files, *chosen]),
        FORK_COLLECTED=str(collected),
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fork_select"]
        + ["-m", "not slow and not docker and not gpu"],
        cwd=copy,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    ids = json.loads(collected.read_text())
    assert ids and not [i for i in ids if i.split("/")[1] in OWN_TEST_FOLDERS]
    assert " passed" in done.stdout.splitlines()[-1] and "failed" not in done.stdout.splitlines()[-1]


@pytest.mark.extra("store")
def test_without_the_store_extra_a_bucket_runs_dir_is_one_line_and_a_folder_still_works(tmp_path):
    copy = clone_of_the_package(tmp_path / "copy")
    _delete_extras(copy, ["store"])
    bucket = train_in(copy, "runs", "--runs-dir", "s3://bucket/runs", check=False)
    assert bucket.returncode == 2, bucket.stderr
    (line,) = bucket.stderr.strip().splitlines()
    assert line.startswith("ConfigError: RUNS_DIR='s3://bucket/runs'") and "(train/store)" in line
    folder = train_in(copy, "runs", "--runs-dir", str(tmp_path / "runs"))
    assert folder.returncode == 0


@pytest.mark.extra("workers")
def test_without_the_workers_extra_a_launchers_cluster_is_one_line_not_independent_runs(tmp_path):
    """Each pod of a launcher's cluster would otherwise train a run of its own, unaware of the others."""
    copy = clone_of_the_package(tmp_path / "copy")
    _delete_extras(copy, ["workers"])
    cluster = '{"cluster": {"worker": ["a:2222", "b:2222"]}, "task": {"type": "worker", "index": 1}}'

    def settings(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "train", "settings", "--env-file", ""],
            cwd=copy,
            capture_output=True,
            text=True,
            env=subprocess_env(PYTHONPATH=str(copy), **env),
            timeout=120,
        )

    refused = settings(TF_CONFIG=cluster)
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("ConfigError: TF_CONFIG=") and "(train/workers)" in line, line
    assert line.endswith("unset TF_CONFIG to train in one process"), line
    nodes = settings(SKYPILOT_NODE_IPS="10.0.0.5\n10.0.0.7\n", SKYPILOT_NODE_RANK="1")
    assert nodes.returncode == 2 and nodes.stderr.strip().endswith("launch one node to train in one process")
    assert settings(SKYPILOT_NODE_IPS="10.0.0.5\n", SKYPILOT_NODE_RANK="0").returncode == 0
    assert settings().returncode == 0
