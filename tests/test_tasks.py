"""tasks.py assembles the right command lines and stops with one clear line when something is missing.

invoke's MockContext records every `c.run`; nothing is executed. tasks.py lives at the repo root
and is not copied into the image, so inside the image these tests skip.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if not (ROOT / "tasks.py").is_file():
    pytest.skip("tasks.py is a host-side file (not in the image)", allow_module_level=True)
invoke = pytest.importorskip("invoke")
sys.path.insert(0, str(ROOT))
from invoke import Config, Context, Exit, MockContext, Result  # noqa: E402

import tasks  # noqa: E402

COMMIT = "abc12345" + "0" * 32  # what `git rev-parse HEAD` answers in ctx()
GPU_RUNTIMES = '{"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}'


def ctx(**overrides: Result) -> MockContext:
    """A context whose `docker info`, `nvidia-smi -L` and git answer like a healthy GPU host."""
    answers = {re.compile(re.escape(k)): v for k, v in overrides.items()}  # first match wins
    answers |= {
        re.compile(r"docker info --format '\{\{\.ServerVersion\}\}'"): Result("24.0.7\n"),
        re.compile(r"docker info --format '\{\{json \.Runtimes\}\}'"): Result(GPU_RUNTIMES),
        re.compile(r"nvidia-smi -L"): Result("GPU 0: NVIDIA H100 (UUID: GPU-1)\n"),
        re.compile(r"git rev-parse HEAD"): Result("abc12345" + "0" * 32 + "\n"),
        re.compile(r"git status.*"): Result(""),
    }
    answers[re.compile(".*")] = Result("")  # every other command "succeeds"
    return MockContext(run=answers, repeat=True)


def commands(c: MockContext) -> list[str]:
    return [call.args[0] for call in c.run.call_args_list]


def echoed(c: MockContext) -> list[str]:
    """The commands the user sees: the ones run with echo=True (not the hidden checks)."""
    return [call.args[0] for call in c.run.call_args_list if call.kwargs.get("echo")]


@pytest.fixture(autouse=True)
def host(monkeypatch, tmp_path):
    """Docker and nvidia-smi on PATH; runs/ and data/ created in a temporary root."""
    monkeypatch.setattr(tasks.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(tasks, "ROOT", tmp_path)
    monkeypatch.delenv("RUNS_DIR", raising=False)  # where a detached local training writes: ./runs here
    monkeypatch.delenv("COMPOSE_FILE", raising=False)  # a GPU host's compose files unless a test says otherwise
    monkeypatch.delenv("IMAGE", raising=False)  # the default image name unless a test sets one
    for lock in tasks.LOCKS.values():
        (tmp_path / lock).parent.mkdir(exist_ok=True)
        (tmp_path / lock).write_text(f"# {lock}\n")
    monkeypatch.setattr(tasks.os, "getuid", lambda: 1234)
    monkeypatch.setattr(tasks.os, "getgid", lambda: 567)


def test_build_tags_with_lock_hash_and_commit():
    c = ctx()
    tasks.build(c, target="cpu")
    (cmd,) = echoed(c)
    import hashlib

    lock_hash = hashlib.sha256(b"# requirements/cpu.lock\n").hexdigest()[:12]
    assert cmd.startswith(
        "DOCKER_BUILDKIT=1 docker build --target runtime --build-arg VARIANT=cpu --build-arg UID=1000 "
        "--build-arg GID=1000 "
        f"--build-arg GIT_COMMIT=abc12345{'0' * 32} "
    )
    assert f"-t tf-train-template:cpu -t tf-train-template:cpu-{lock_hash}-abc12345 ." in cmd


@pytest.mark.parametrize("where", ["env", ".env"])
def test_build_tags_the_image_compose_runs_when_image_is_set_in_the_environment_or_in_dot_env(monkeypatch, where):
    """docker-compose.yml names ${IMAGE:-tf-train-template}, which compose also reads from .env."""
    if where == "env":
        monkeypatch.setenv("IMAGE", "registry.example/team/tpl")
    else:
        (tasks.ROOT / ".env").write_text("EPOCHS=2\nIMAGE=registry.example/team/tpl\n")
    c = ctx()
    tasks.build(c, target="cpu")
    (cmd,) = echoed(c)
    assert (
        " -t registry.example/team/tpl:cpu -t registry.example/team/tpl:cpu-" in cmd and "tf-train-template" not in cmd
    )


def test_build_marks_a_dirty_tree_and_passes_base_ca_and_network(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    c = ctx(**{"git status --porcelain --untracked-files=no": Result(" M train/training/fit.py\n")})
    tasks.build(c, base_image="mirror/python:3.11", ca_bundle=str(ca), network="host", uid=2000)
    (cmd,) = echoed(c)
    assert "--target runtime --build-arg VARIANT=gpu --build-arg UID=2000" in cmd
    assert f"--build-arg BASE_IMAGE=mirror/python:3.11 --secret id=ca_bundle,src={ca} --network host" in cmd
    assert re.search(r"-t tf-train-template:gpu-[0-9a-f]{12}-abc12345-dirty \.$", cmd)


def test_build_outside_git_tags_nogit_and_bakes_no_commit():
    c = ctx(**{"git rev-parse HEAD": Result("", exited=128)})
    tasks.build(c, target="cpu")
    (cmd,) = echoed(c)
    assert "GIT_COMMIT" not in cmd and re.search(r"-t tf-train-template:cpu-[0-9a-f]{12}-nogit \.$", cmd)


def test_build_rejects_a_bad_target_and_a_missing_ca_bundle():
    with pytest.raises(Exit, match="--target 'tpu' is not valid: gpu or cpu"):
        tasks.build(ctx(), target="tpu")
    with pytest.raises(Exit, match="--ca-bundle '/nope.pem' is not a file"):
        tasks.build(ctx(), ca_bundle="/nope.pem")


def test_train_runs_compose_as_the_host_user_with_the_gpu():
    c = ctx()
    tasks.train(c, args="--epochs 5")
    assert echoed(c) == [
        f"TRAIN_ARGS='--epochs 5' GIT_COMMIT={COMMIT} HOST_UID=1234 HOST_GID=567 docker compose up "
        "--exit-code-from train train"
    ]
    assert (tasks.ROOT / "runs").is_dir() and (tasks.ROOT / "data").is_dir()


def test_train_cpu_detached_uses_the_cpu_override_and_needs_no_gpu():
    c = ctx(**{"nvidia-smi -L": Result("", exited=1)})
    tasks.train(c, cpu=True, detach=True)
    assert echoed(c) == [
        f"GIT_COMMIT={COMMIT} HOST_UID=1234 HOST_GID=567 docker compose -f docker-compose.yml "
        "-f docker-compose.cpu.yml up --detach train"
    ]
    assert not any("nvidia-smi" in cmd for cmd in commands(c))


def _compose_file_in(where: str, value: str, monkeypatch) -> None:
    """COMPOSE_FILE in the environment, or in .env beside another setting, as compose reads either."""
    if where == "env":
        monkeypatch.setenv("COMPOSE_FILE", value)
    else:
        (tasks.ROOT / ".env").write_text(f"EPOCHS=2\nCOMPOSE_FILE={value}\n")


@pytest.mark.parametrize("where", ["env", ".env"])
def test_a_compose_file_that_adds_the_cpu_file_is_the_cpu_choice_without_cpu(monkeypatch, where):
    """The quick start's CPU line puts COMPOSE_FILE in .env: the tasks refused such a host for its
    missing GPU until --cpu was added, and --cpu's -f files replaced COMPOSE_FILE's own list."""
    _compose_file_in(where, "docker-compose.yml:docker-compose.cpu.yml:compose.mine.yml", monkeypatch)
    c = ctx(**{"nvidia-smi -L": Result("", exited=1)})
    tasks.train(c)
    tasks.train(c, cpu=True)
    tasks.gpu_check(c)
    tasks.build(c)
    compose = "HOST_UID=1234 HOST_GID=567 docker compose"
    assert echoed(c)[:3] == [f"GIT_COMMIT={COMMIT} {compose} up --exit-code-from train train"] * 2 + [
        f"{compose} run --rm train check"
    ]
    assert "--build-arg VARIANT=cpu" in echoed(c)[3] and "-t tf-train-template:cpu " in echoed(c)[3]
    assert not any("nvidia-smi" in cmd for cmd in commands(c))


def test_a_dot_env_that_cannot_be_read_for_compose_file_is_one_line_naming_it():
    (tasks.ROOT / ".env").write_bytes(b"EPOCHS=2\n\xff\n")
    with pytest.raises(
        Exit, match=r"^EnvFileError: .*\.env, line 2: byte 0xff is not UTF-8 text; save the file as UTF-8$"
    ):
        tasks.train(ctx())


def test_a_compose_file_without_the_cpu_file_still_needs_the_gpu(monkeypatch):
    monkeypatch.setenv("COMPOSE_FILE", "docker-compose.yml:docker-compose.cpu.yml.orig")
    with pytest.raises(Exit, match="no NVIDIA GPU found on this host"):
        tasks.train(ctx(**{"nvidia-smi -L": Result("", exited=1)}))


@pytest.mark.parametrize("where", ["env", ".env"])
def test_cpu_adds_the_cpu_file_to_a_compose_file_list_instead_of_replacing_it(monkeypatch, where):
    """`-f` files replace COMPOSE_FILE's list: an override the user listed there was dropped by --cpu."""
    _compose_file_in(where, "docker-compose.yml:compose.mine.yml", monkeypatch)
    c = ctx(**{"nvidia-smi -L": Result("", exited=1)})
    tasks.train(c, cpu=True)
    assert echoed(c) == [
        f"GIT_COMMIT={COMMIT} COMPOSE_FILE=docker-compose.yml:compose.mine.yml:docker-compose.cpu.yml "
        "HOST_UID=1234 HOST_GID=567 docker compose up --exit-code-from train train"
    ]


def test_train_outside_git_passes_no_commit():
    c = ctx(**{"git rev-parse HEAD": Result("", exited=128)})
    tasks.train(c, cpu=True)
    assert echoed(c)[0].startswith("HOST_UID=1234 HOST_GID=567 docker compose")


def test_train_local_and_detached_local():
    c = ctx()
    tasks.train(c, local=True, args="--smoke")
    tasks.train(c, local=True, detach=True)
    # appended (>>): a second detached run keeps the first's output and does not cut the file under it
    assert echoed(c) == [f"{tasks.PY} -m train fit --smoke", f"nohup {tasks.PY} -m train fit >> runs/nohup.out 2>&1 &"]
    assert c.run.call_args_list[-1].kwargs["disown"] is True
    assert not any(cmd.startswith("docker") for cmd in commands(c))


def shell() -> Context:
    """A context whose commands really run in a shell (stdin left alone: pytest captures it)."""
    return Context(Config(overrides={"run": {"in_stream": False, "hide": True}}))


@pytest.mark.parametrize(
    "call",
    [
        lambda args: tasks.train(shell(), local=True, args=args),
        lambda args: tasks.train(shell(), local=True, workers=2, args=args),
        lambda args: tasks.sweep(shell(), space="space.toml", local=True, args=args),
        lambda args: tasks.test(shell(), args=args),
        lambda args: tasks.bench(shell(), json=str(tasks.ROOT / "r.json"), args=args),
        lambda args: tasks.compare(shell(), runs=args),
    ],
    ids=["train", "train-workers", "sweep", "test", "bench", "compare"],
)
def test_args_reach_the_command_as_words_and_never_run_in_the_shell(monkeypatch, tmp_path, call):
    monkeypatch.setattr(tasks, "PY", "true")  # a real shell runs the line; `true` stands for python
    pwned = tmp_path / "pwned"
    call(f"--smoke; touch {pwned} && touch {pwned}-2 $(touch {pwned}-3)")
    assert list(tmp_path.glob("pwned*")) == []


@pytest.mark.parametrize("task", [tasks.train, tasks.test, tasks.bench])
def test_args_with_an_unclosed_quote_stop_with_one_line_before_running_anything(task):
    c = ctx()
    with pytest.raises(Exit, match=r"^--args \"--epochs '5\": No closing quotation: close the quote"):
        task(c, args="--epochs '5")
    assert commands(c) == []


def test_compare_with_an_unclosed_quote_names_the_runs():
    with pytest.raises(Exit, match=r"^--runs \"a 'b\": No closing quotation"):
        tasks.compare(ctx(), runs="a 'b")


@pytest.mark.parametrize(
    "missing, message",
    [
        ("docker", "Docker is not installed"),
        ("nvidia-smi", "no NVIDIA GPU found on this host"),
    ],
)
def test_missing_tools_stop_with_one_line(monkeypatch, missing, message):
    monkeypatch.setattr(tasks.shutil, "which", lambda name: None if name == missing else f"/usr/bin/{name}")
    with pytest.raises(Exit, match=message) as err:
        tasks.train(ctx())
    assert "\n" not in str(err.value.message)


def test_engine_not_running_stops_with_one_line():
    c = ctx(**{"docker info --format '{{.ServerVersion}}'": Result("", exited=1)})
    with pytest.raises(Exit, match=r"the Docker engine is not reachable: start it .*log in again\)$"):
        tasks.build(c)  # no --local: building is Docker's alone
    # a host with the docker CLI and no engine, as one without Docker: the task's --local is the way on
    with pytest.raises(Exit, match=r"log in again\), or use --local$"):
        tasks.report(c)


def test_missing_nvidia_runtime_names_the_toolkit(monkeypatch):
    monkeypatch.setattr(tasks.shutil, "which", lambda n: None if n == "nvidia-container-runtime-hook" else f"/bin/{n}")
    c = ctx(**{"docker info --format '{{json .Runtimes}}'": Result('{"runc":{"path":"runc"}}')})
    with pytest.raises(Exit, match="NVIDIA container toolkit is not set up for Docker.*or add --cpu") as stopped:
        tasks.gpu_check(c)
    # the plain compose command too, for a newcomer who ran `docker compose up` first
    assert "docker compose -f docker-compose.yml -f docker-compose.cpu.yml" in str(stopped.value)


def test_no_gpu_names_the_driver_from_the_stack_table():
    pytest.importorskip("train.gpucheck.stack")  # the optional GPU check holds the table
    c = ctx(**{"nvidia-smi -L": Result("No devices found.\n", exited=6)})
    with pytest.raises(
        Exit,
        match=r"install the NVIDIA driver >= 525\.60\.13 \(>= 555\.42\.06 for H100, H200 and newer GPUs\); or add --cpu",
    ):
        tasks.gpu_check(c)


def test_no_gpu_without_the_gpu_check_still_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "train.gpucheck.stack", None)  # as if train/gpucheck/ were deleted
    c = ctx(**{"nvidia-smi -L": Result("No devices found.\n", exited=6)})
    with pytest.raises(
        Exit, match=r"install the NVIDIA driver that supports the CUDA of requirements/gpu\.lock; or add --cpu"
    ):
        tasks.gpu_check(c)


def test_gpu_check_container_and_local():
    c = ctx()
    tasks.gpu_check(c)
    tasks.gpu_check(c, local=True)
    tasks.gpu_check(c, cpu=True)
    assert echoed(c) == [
        "HOST_UID=1234 HOST_GID=567 docker compose run --rm train check --require-gpu",
        f"{tasks.PY} -m train check --require-gpu",
        "HOST_UID=1234 HOST_GID=567 docker compose -f docker-compose.yml -f docker-compose.cpu.yml run --rm train check",
    ]


def test_export_logs_tensorboard():
    c = ctx()
    tasks.export(c, run="20240101-000000 x")
    tasks.export(c, local=True)
    tasks.logs(c, follow=True)
    (tasks.ROOT / "runs" / "nohup.out").write_text("")  # what `invoke train --local --detach` writes
    tasks.logs(c, local=True)
    tasks.tensorboard(c, port=7007, cpu=True)
    tasks.tensorboard(c, stop=True)
    compose = "HOST_UID=1234 HOST_GID=567 docker compose"
    cpu = f"{compose} -f docker-compose.yml -f docker-compose.cpu.yml"
    assert echoed(c) == [
        f"{compose} run --rm train export '20240101-000000 x'",
        f"{tasks.PY} -m train export latest",
        f"{compose} logs -f train",
        "tail -n 100 runs/nohup.out",
        f"TENSORBOARD_PORT=7007 {cpu} up --detach tensorboard",
        f"{compose} stop tensorboard",
    ]


def test_local_logs_without_a_detached_local_training_say_how_to_start_one():
    c = ctx()
    with pytest.raises(Exit, match=r"^runs/nohup.out does not exist: .*`invoke train --local --detach`$"):
        tasks.logs(c, local=True, follow=True)
    assert commands(c) == []


def test_a_detached_local_training_writes_its_output_under_runs_dir_and_local_logs_read_it_there(monkeypatch):
    (tasks.ROOT / ".env").write_text(f"RUNS_DIR={tasks.ROOT / 'elsewhere'}\n")  # as `python -m train` reads it
    monkeypatch.setenv("RUNS_DIR", str(tasks.ROOT / "mine"))  # the environment before .env, as there
    c = ctx()
    tasks.train(c, local=True, detach=True)
    out = tasks.ROOT / "mine" / "nohup.out"
    out.write_text("")  # what the shell's >> makes, in the folder the task made for it
    tasks.logs(c, local=True)
    assert echoed(c) == [f"nohup {tasks.PY} -m train fit >> {out} 2>&1 &", f"tail -n 100 {out}"]
    monkeypatch.delenv("RUNS_DIR")
    with pytest.raises(Exit, match=f"^{tasks.ROOT / 'elsewhere' / 'nohup.out'} does not exist: "):
        tasks.logs(c, local=True)
    # A bucket is no folder to append to: the output stays on this machine, in ./runs.
    monkeypatch.setenv("RUNS_DIR", "s3://bucket/runs")
    tasks.train(c, local=True, detach=True)
    assert echoed(c)[-1] == f"nohup {tasks.PY} -m train fit >> runs/nohup.out 2>&1 &"


@pytest.mark.extra("store")  # an s3:// RUNS_DIR
def test_local_tensorboard_reads_runs_dir_as_python_m_train_does(monkeypatch):
    """It read ./runs whatever RUNS_DIR said."""
    (tasks.ROOT / ".env").write_text("RUNS_DIR=/data/my runs\n")
    c = ctx()
    tasks.tensorboard(c, local=True)
    tb = f"{tasks.PY} -m tensorboard.main --logdir"
    monkeypatch.setenv("RUNS_DIR", "s3://bucket/runs")
    with pytest.raises(Exit) as info:
        tasks.tensorboard(c, local=True, port=7007)
    assert str(info.value) == (
        "RUNS_DIR s3://bucket/runs is in object storage, which TensorBoard cannot read: set RUNS_DIR to a "
        "folder for this command (the runs trained on this machine are in STORE_CACHE: docs/storage.md)"
    )
    (tasks.ROOT / ".env").unlink()
    monkeypatch.delenv("RUNS_DIR")
    tasks.tensorboard(c, local=True, port=7007)
    assert echoed(c) == [
        f"{tb} '/data/my runs' --host 127.0.0.1 --port 6006",
        f"{tb} runs --host 127.0.0.1 --port 7007",
    ]


def test_report_and_compare():
    c = ctx()
    tasks.report(c, run="20240101-000000 x")
    tasks.report(c, local=True, quick=True)
    tasks.report(c, cpu=True)
    tasks.compare(c, runs="a  b 'c d'", out="my runs.html")
    tasks.compare(c, runs="a b")
    compose = "HOST_UID=1234 HOST_GID=567 docker compose"
    assert echoed(c) == [
        f"{compose} run --rm train report '20240101-000000 x'",
        f"{tasks.PY} -m train report latest --quick",
        f"{compose} -f docker-compose.yml -f docker-compose.cpu.yml run --rm train report latest",
        f"{tasks.PY} -m train compare a b 'c d' --out 'my runs.html'",
        f"{tasks.PY} -m train compare a b",
    ]


def test_test_and_bench_use_the_current_interpreter(tmp_path):
    c = ctx()
    tasks.test(c)
    tasks.test(c, args="tests/test_config.py", all=True)
    out = tmp_path / "b" / "r.json"
    tasks.bench(c, json=str(out))
    assert echoed(c) == [
        f"{tasks.PY} -m pytest -q -n auto -m 'not slow and not gpu and not docker and not bench'",
        f"{tasks.PY} -m pytest -q -n auto tests/test_config.py",
        f"{tasks.PY} -m pytest benchmarks/ --benchmark-enable --benchmark-json {out}",
    ]
    assert out.parent.is_dir()


def _writing_the_report(c: MockContext, out: Path, exited: int = 0) -> MockContext:
    """Make the benchmark command write its JSON report (and exit with `exited`), as pytest-benchmark does."""
    real = c.run._mock_wraps

    def run(command, **kwargs):
        if "--benchmark-json" in command:
            out.write_text('{"benchmarks": []}')
            return Result(exited=exited)
        return real(command, **kwargs)

    c.run.side_effect = run
    return c


def test_bench_prints_the_ratio_table_of_the_report_it_wrote(tmp_path, capsys):
    out = tmp_path / "r.json"
    c = _writing_the_report(ctx(), out)
    tasks.bench(c, json=str(out))
    assert echoed(c) == [
        f"{tasks.PY} -m pytest benchmarks/ --benchmark-enable --benchmark-json {out}",
        f"{tasks.PY} benchmarks/summarise.py {out}",
    ]
    assert capsys.readouterr().out == ""


def test_bench_quick_is_an_option_and_says_its_ratios_mean_nothing(tmp_path, capsys):
    out = tmp_path / "r.json"
    c = _writing_the_report(ctx(), out)
    tasks.bench(c, json=str(out), quick=True, args="-k pipeline")
    assert (
        echoed(c)[0]
        == f"{tasks.PY} -m pytest benchmarks/ --benchmark-enable --benchmark-json {out} --bench-quick -k pipeline"
    )
    assert echoed(c)[1] == f"{tasks.PY} benchmarks/summarise.py {out}"
    assert "ratios only show that the benchmarks run" in capsys.readouterr().out
    assert "quick" in tasks.bench.help and "--bench-quick" in (ROOT / "benchmarks" / "conftest.py").read_text()


def test_bench_shows_the_ratios_of_a_failed_run_but_not_an_old_report_and_keeps_the_exit_code(tmp_path):
    out = tmp_path / "r.json"
    c = _writing_the_report(ctx(), out, exited=1)
    with pytest.raises(Exit) as failed:
        tasks.bench(c, json=str(out))
    assert failed.value.code == 1 and len(echoed(c)) == 2  # the others' ratios are still shown
    old = ctx(**{f"{tasks.PY} -m pytest benchmarks/": Result(exited=2)})  # a collection error: no new report
    with pytest.raises(Exit) as failed:
        tasks.bench(old, json=str(out))
    assert failed.value.code == 2 and echoed(old) == [echoed(c)[0]]


@pytest.mark.parametrize(
    "where, why",
    [
        ("a-file/r.json", "File exists"),
        ("a-file/deeper/r.json", "Not a directory"),
        pytest.param(
            "/proc/r.json", "", marks=pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="Linux /proc")
        ),
    ],
)
def test_bench_refuses_a_report_it_cannot_write_before_running_the_benchmarks(tmp_path, where, why):
    (tmp_path / "a-file").write_text("kept\n")
    report = str(tmp_path / where)  # an absolute `where` stays itself
    c = ctx()
    with pytest.raises(Exit, match=f"^--json {re.escape(repr(report))}: .*{why}"):
        tasks.bench(c, json=report)
    assert commands(c) == [] and (tmp_path / "a-file").read_text() == "kept\n"


def test_lock_compiles_everything_together_then_each_lock_held_to_it_then_checks_the_stack(monkeypatch):
    (tasks.ROOT / "requirements" / "all.lock").write_text("numpy==2.3.4 \\\n    --hash=sha256:0\n")
    c = ctx()
    tasks.lock(c, package="numpy")
    every, gpu, cpu, test, *rest = echoed(c)
    extras, (server, sky, runtime, dvc, *check) = rest[: len(tasks.EXTRAS)], rest[len(tasks.EXTRAS) :]
    assert every.startswith("uv pip compile requirements/all.in --universal --python-version 3.10 --generate-hashes")
    assert every.endswith("--upgrade-package numpy -o requirements/all.lock")
    for cmd, name in zip([gpu, cpu, test, *extras], ["gpu", "cpu", "test", *tasks.EXTRAS]):
        assert cmd.startswith(f"uv pip compile requirements/{name}.in -c requirements/all.lock --universal")
        assert cmd.endswith(f"--upgrade-package numpy -o requirements/{name}.lock")
    # Every extra the locks know is one that all.in brings in and pyproject.toml names.
    every_in = (ROOT / "requirements" / "all.in").read_text()
    groups = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]\n")[1].split("\n\n")[0]
    assert sorted(tasks.EXTRAS) == sorted(re.findall(r"^([a-z]+) = \[", groups, re.M))
    assert all(f"-r {name}.in" in every_in for name in tasks.EXTRAS)
    assert server.startswith("uv pip compile requirements/mlflow-server.in --universal")
    assert server.endswith("-o requirements/mlflow-server.lock")
    assert sky.startswith("uv pip compile requirements/skypilot.in --universal")
    assert sky.endswith("-o requirements/skypilot.lock")
    assert runtime.startswith("uv pip compile requirements/runtime-check.in --universal")
    assert runtime.endswith("-o requirements/runtime-check.lock")
    assert dvc.startswith("uv pip compile requirements/dvc.in --universal") and dvc.endswith("-o requirements/dvc.lock")
    # The stack table belongs to the optional GPU check: a fork without train/gpucheck/ skips this step.
    assert check == ([f"{tasks.PY} -m train.gpucheck.stack"] if (ROOT / "train" / "gpucheck").is_dir() else [])
    monkeypatch.setitem(sys.modules, "train.gpucheck", None)  # as if train/gpucheck/ were deleted
    tasks.lock(c, package="numpy")
    again = [every, gpu, cpu, test, *extras, server, sky, runtime, dvc]
    assert echoed(c)[-len(again) :] == again and len(echoed(c)) == 2 * len(again) + len(check)


def test_lock_refuses_a_package_no_lock_holds_before_compiling_anything():
    (tasks.ROOT / "requirements" / "all.lock").write_text("typing-extensions==4.15.0 \\\n    --hash=sha256:0\n")
    c = ctx()
    with pytest.raises(Exit, match=r"^--package 'typing-extension' is in none .* did you mean 'typing-extensions'\?"):
        tasks.lock(c, package="typing-extension")
    assert commands(c) == []
    tasks.lock(c, package="Typing_Extensions<5")  # the name as pip compares it, and a bound uv accepts
    assert "--upgrade-package 'Typing_Extensions<5'" in echoed(c)[0]


def test_lock_without_uv_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(tasks.shutil, "which", lambda name: None)
    with pytest.raises(Exit, match="uv is not installed: `pip install uv`"):
        tasks.lock(ctx())


def test_clean_never_touches_runs_or_data():
    c = ctx()
    tasks.clean(c, images=True)
    assert all("runs" not in cmd and "data" not in cmd for cmd in echoed(c))
    assert "HOST_UID=1234 HOST_GID=567 docker compose down --rmi all" in echoed(c)


def test_clean_images_removes_every_tag_of_the_image_and_nothing_else(monkeypatch):
    """`build`'s commit tags and the serve image are no compose service's image: `down --rmi all` leaves them."""
    monkeypatch.setenv("IMAGE", "team/trainer")
    listing = "docker image ls --filter reference=team/trainer --format '{{.Repository}}:{{.Tag}}'"
    tags = "team/trainer:gpu-0123abcd-abc12345\nteam/trainer:serve\nteam/trainer:gpu-0123abcd-abc12345\n"
    c = ctx(**{listing: Result(tags)})
    tasks.clean(c, images=True)
    assert listing in commands(c)
    assert echoed(c)[-1] == "docker rmi team/trainer:gpu-0123abcd-abc12345 team/trainer:serve"
    c = ctx()  # no tag left: no rmi (docker rmi without a name is an error)
    tasks.clean(c, images=True)
    assert not any(cmd.startswith("docker rmi") for cmd in commands(c))


def test_clean_removes_the_containers_of_every_profile_too():
    """`invoke tensorboard --stop` leaves a stopped container of the tensorboard profile, which a plain
    `docker compose down` does not see."""
    c = ctx()
    tasks.clean(c)
    assert echoed(c)[-1] == "HOST_UID=1234 HOST_GID=567 docker compose --profile '*' down --remove-orphans"


def test_clean_with_the_engine_stopped_says_the_caches_went_and_the_containers_did_not():
    c = ctx(**{"docker info --format '{{.ServerVersion}}'": Result("", exited=1)})
    with pytest.raises(Exit, match=r"^caches removed; the containers were not: the Docker engine is not reachable"):
        tasks.clean(c)
    assert echoed(c)[0].startswith("rm -rf .pytest_cache")


def test_every_task_argument_has_help():
    for name, t in tasks.ns.tasks.items():
        params = [p for p in t.get_arguments() if p.name not in ("help",)]
        missing = [p.name for p in params if not p.help]
        assert not missing, f"{name}: no help for {missing}"
        assert t.__doc__, f"{name} has no docstring"


def test_mutate_installs_mutmut_into_its_own_venv_once_then_runs_the_modules(tmp_path):
    (tmp_path / "train").mkdir()
    for name in ("rundir", "checkpoints"):
        (tmp_path / "train" / f"{name}.py").write_text("")
    c = ctx()
    tasks.mutate(c, modules="rundir, checkpoints")
    venv = tmp_path / ".venv-mutmut"
    install, run = echoed(c)[1:]
    assert echoed(c)[0] == f"{tasks.PY} -m venv {venv}"
    assert install == f"{venv}/bin/python -m pip install -q mutmut==3.8.1"
    assert run == f"{venv}/bin/mutmut run --max-children 1 'train.rundir.*' 'train.checkpoints.*'"
    (pth,) = venv.rglob("project-venv.pth")  # the project's packages, without a second TensorFlow
    assert "site-packages" in str(pth.parent) and pth.read_text().strip().endswith("site-packages")

    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "mutmut").write_text("")
    c = ctx()
    tasks.mutate(c, workers=2)
    tasks.mutate(c, results=True)
    assert echoed(c) == [f"{venv}/bin/mutmut run --max-children 2", f"{venv}/bin/mutmut results"]


def test_reproduce_runs_the_package_command_with_its_flags():
    c = ctx()
    tasks.reproduce(c, run="20240101-000000-ab12", local=True)
    tasks.reproduce(c, run="latest", local=True, allow_dirty=True, epochs=1)
    tasks.reproduce(c, run="latest", base_image="mirror/python:3.11")
    assert echoed(c)[:2] == [
        f"{tasks.PY} -m train reproduce 20240101-000000-ab12 --local",
        f"{tasks.PY} -m train reproduce latest --local --allow-dirty --epochs 1",
    ]
    assert echoed(c)[-1] == (
        f"{tasks.PY} -m train reproduce latest --container --data-dir data --base-image mirror/python:3.11"
    )


def test_mutate_refuses_an_unknown_module_before_installing_anything(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "rundir.py").write_text("")
    c = ctx()
    with pytest.raises(Exit, match=r"--modules 'rundir,nope': no train/nope.py or train/nope/; give module or"):
        tasks.mutate(c, modules="rundir,nope")
    assert commands(c) == [] and not (tmp_path / ".venv-mutmut").exists()


def _project_layout(tmp_path: Path) -> None:
    """The configured modules of [tool.mutmut] as empty files, plus one module it leaves out."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path in tasks._mutated_paths() + ["train/run/lock.py"]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")


@pytest.mark.parametrize("modules", [",", " , ,"])
def test_mutate_with_modules_that_name_nothing_refuses_instead_of_mutating_everything(tmp_path, modules):
    c = ctx()
    with pytest.raises(Exit, match=f"^--modules {re.escape(repr(modules))} names no module: "):
        tasks.mutate(c, modules=modules)
    assert commands(c) == [] and not (tmp_path / ".venv-mutmut").exists()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="reads pyproject.toml with tomllib (Python 3.11+)")
def test_mutate_takes_the_modules_and_packages_of_each_checked_area(tmp_path):
    _project_layout(tmp_path)
    c = ctx()
    # the last two as mutmut's names and only_mutate's paths write them
    tasks.mutate(
        c, modules="reproduce,tracking.mlflow_run,training.early_stopping,train.results.compare,train/results/report.py"
    )
    names = "'train.reproduce.*' 'train.tracking.mlflow_run.*' 'train.training.early_stopping.*'"
    assert echoed(c)[-1].endswith(
        f"mutmut run --max-children 1 {names} 'train.results.compare.*' 'train.results.report.*'"
    )


@pytest.mark.skipif(sys.version_info < (3, 11), reason="reads pyproject.toml with tomllib (Python 3.11+)")
@pytest.mark.parametrize("name", ["run.lock", "track"])
def test_mutate_refuses_a_module_mutmut_is_not_configured_for_naming_the_configured_ones(tmp_path, name):
    _project_layout(tmp_path)
    (tmp_path / "train" / "track.py").write_text("")
    c = ctx()
    with pytest.raises(Exit) as info:
        tasks.mutate(c, modules=f"run.rundir,{name}")
    message = str(info.value)
    assert f"train/{name.replace('.', '/')} is not mutated; add it to only_mutate in [tool.mutmut]" in message
    assert "run.rundir,run.checkpoints," in message and "\n" not in message
    assert commands(c) == [] and not (tmp_path / ".venv-mutmut").exists()


def test_train_with_workers_local_starts_one_cluster_chief_in_the_foreground(monkeypatch):
    monkeypatch.setattr(tasks.os, "sched_getaffinity", lambda _pid: set(range(4)))  # a host of 4 cores
    monkeypatch.setattr(tasks, "free_ports", lambda n: [5000 + i for i in range(n)])
    c = ctx()
    tasks.train(c, local=True, workers=3, args="--smoke")
    (cmd,) = echoed(c)
    cluster = "WORKERS=127.0.0.1:5000,127.0.0.1:5001,127.0.0.1:5002"
    fit = f"{tasks.PY} -m train fit --smoke"
    assert cmd == (
        f"{cluster} WORKER_INDEX=1 {fit} & {cluster} WORKER_INDEX=2 {fit} & "
        f"{cluster} WORKER_INDEX=0 {fit}; rc=$?; wait; exit $rc"
    )


def test_free_ports_are_distinct_and_bindable():
    import socket

    ports = tasks.free_ports(3)
    assert len(set(ports)) == 3
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_train_with_two_workers_in_containers_uses_the_multiworker_compose_file():
    c = ctx()
    tasks.train(c, workers=2, args="--epochs 1")
    assert echoed(c)[-1] == (
        "TRAIN_ARGS='--epochs 1' HOST_UID=1234 HOST_GID=567 docker compose "
        "-f docker-compose.multiworker.yml up --exit-code-from worker0"
    )


@pytest.mark.parametrize(
    "kw, words", [({"workers": 3}, "defines 2 workers"), ({"workers": 2, "detach": True}, "--detach")]
)
def test_train_with_workers_refuses_what_it_cannot_do(kw, words):
    with pytest.raises(Exit) as info:
        tasks.train(ctx(), **kw)
    assert words in str(info.value)


@pytest.mark.parametrize("workers", [0, -1])
@pytest.mark.parametrize(
    "call",
    [
        lambda c, n: tasks.train(c, workers=n),
        lambda c, n: tasks.train(c, local=True, workers=n),
        lambda c, n: tasks.sweep(c, space="space.toml", workers=n),
        lambda c, n: tasks.mutate(c, workers=n),
    ],
    ids=["train", "train-local", "sweep", "mutate"],
)
def test_workers_below_one_are_refused_before_anything_runs(call, workers):
    c = ctx()
    with pytest.raises(Exit, match=f"^--workers {workers}: give 1 or more$"):
        call(c, workers)
    assert commands(c) == []


@pytest.mark.parametrize("cores, most, count", [(1, 2, "1 core"), (4, 4, "4 cores")])
def test_more_local_workers_than_the_hosts_cores_are_refused_before_anything_runs(monkeypatch, cores, most, count):
    """Each local worker is a TensorFlow process: `--workers 20` for 2 started twenty of them. Two are
    let through on one core, to try the several-machines path."""
    monkeypatch.setattr(tasks.os, "sched_getaffinity", lambda _pid: set(range(cores)))
    monkeypatch.setattr(tasks, "free_ports", lambda n: [5000 + i for i in range(n)])
    c = ctx()
    with pytest.raises(Exit) as info:
        tasks.train(c, local=True, workers=most + 1)
    assert str(info.value) == (
        f"--workers {most + 1}: more TensorFlow processes than this host's {count} can run; give at "
        f"most {most}, or start the workers on several machines (docs/distributed.md)"
    )
    assert commands(c) == []
    tasks.train(c, local=True, workers=most)
    assert len(commands(c)) == 1


def test_local_workers_are_counted_against_the_machines_cores_where_no_affinity_is_known(monkeypatch):
    """macOS has no os.sched_getaffinity: `invoke train --local --workers 2` ended in an AttributeError."""
    monkeypatch.delattr(tasks.os, "sched_getaffinity")
    monkeypatch.setattr(tasks.os, "cpu_count", lambda: 3)
    monkeypatch.setattr(tasks, "free_ports", lambda n: [5000 + i for i in range(n)])
    c = ctx()
    with pytest.raises(Exit, match=r"^--workers 4: more TensorFlow processes than this host's 3 cores can run"):
        tasks.train(c, local=True, workers=4)
    tasks.train(c, local=True, workers=3)
    assert len(commands(c)) == 1


LIST_WIDTH = 60  # `invoke --list` wraps at the terminal's width: 80 columns leave 63 beside the names


def test_invoke_list_shows_every_tasks_first_line_whole_on_one_line(monkeypatch, capsys):
    """invoke lists the first line of each docstring (a sentence cut by a line break is shown cut),
    wrapped to the terminal: each first line is the whole first sentence, and fits."""
    import invoke.program

    monkeypatch.setattr(invoke.program, "pty_size", lambda: (80, 24))
    invoke.Program(namespace=tasks.ns).run(["invoke", "--list"], exit=False)
    entries = [line for line in capsys.readouterr().out.splitlines()[1:] if line.strip()]
    names = sorted(tasks.ns.task_names)
    assert [line.split()[0] for line in entries] == names  # no wrapped continuation lines
    for name in names:
        paragraph = tasks.ns[name].__doc__.strip().split("\n\n")[0]
        assert "\n" not in paragraph and paragraph.endswith("."), f"{name}: {paragraph!r}"
        assert len(paragraph) <= LIST_WIDTH, f"{name}: {len(paragraph)} characters: {paragraph!r}"


# --- scripts/venv.sh: the host set-up of scripts/train and scripts/test -----------------------------


@pytest.fixture(params=["pip", "uv"])
def clone(tmp_path, request):
    """A copy of scripts/venv.sh beside fake locks, and a PYTHON whose venv's python logs what it is
    asked; for "uv", a `uv` on PATH that logs the same way (scripts/venv.sh then installs with it)."""
    import shlex
    import shutil
    import stat

    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "venv.sh", tmp_path / "scripts" / "venv.sh")
    (tmp_path / "requirements").mkdir(exist_ok=True)  # the autouse fixture made it for the locks
    (tmp_path / "requirements/cpu.lock").write_text("numpy==2.0 \\\n    --hash=sha256:aa\ntensorflow-cpu==2.21\n")
    (tmp_path / "requirements/test.lock").write_text("pytest==9.0\n")
    (tmp_path / "requirements/all.in").write_text("-r gpu.in\n-r store.in\n")  # one extra: store
    (tmp_path / "requirements/store.lock").write_text("obstore==0.12\n")
    log = tmp_path / "pip.log"
    recorder = f'#!/bin/sh\necho "$*" >> {log}\n'
    fake = tmp_path / "fakepython"
    fake.write_text(
        f"#!/bin/sh\nmkdir -p .venv/bin\nprintf %s {shlex.quote(recorder)} > .venv/bin/python\nchmod +x .venv/bin/python\n"
        "touch .venv/bin/pip\nchmod +x .venv/bin/pip\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "bin").mkdir()
    if request.param == "uv":
        (tmp_path / "bin" / "uv").write_text(recorder)
        (tmp_path / "bin" / "uv").chmod(0o755)
    return tmp_path


def venv_env(clone: Path) -> dict[str, str]:
    """PYTHON the clone's fake; PATH the system's tools and the clone's bin (a fake uv, or none), never
    this machine's own uv."""
    import os

    return {**os.environ, "PYTHON": str(clone / "fakepython"), "PATH": f"{clone / 'bin'}:/usr/bin:/bin"}


def venv_sh(clone: Path, *args: str) -> tuple[list[str], str]:
    """Run the copied scripts/venv.sh; return the pip commands it ran (this time) and what it printed."""
    import subprocess

    log = clone / "pip.log"
    log.unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", "scripts/venv.sh", *args], cwd=clone, env=venv_env(clone), capture_output=True, text=True, check=True
    )
    with_uv = (clone / "bin" / "uv").exists()
    prefix = "pip install --quiet --python .venv/bin/python --compile-bytecode " if with_uv else "-m pip install "
    lines = log.read_text().splitlines() if log.exists() else []
    assert all(line.startswith(prefix) for line in lines), (prefix, lines)
    pip = [
        line.removeprefix(prefix).replace("--disable-pip-version-check ", "").replace("--quiet ", "") for line in lines
    ]
    return pip, done.stderr


def test_scripts_train_installs_only_the_runtime_lock_and_says_so_first(clone):
    pip, said = venv_sh(clone)
    assert pip == ["--require-hashes -r requirements/cpu.lock", "--no-deps -e ."]
    assert said.startswith("scripts/venv.sh: installing the 2 pinned packages of requirements/cpu.lock into .venv")
    assert "a few minutes" in said
    assert venv_sh(clone) == ([], "")  # stamped: nothing to do


def test_the_count_said_is_of_packages_not_of_pins_a_lock_repeats_per_python_version(clone):
    """The real cpu.lock pins 58 lines for 48 packages (numpy once per Python version): the line said
    before a long install counts what it installs, as the README does."""
    (clone / "requirements/cpu.lock").write_text(
        'numpy==2.2 ; python_version < "3.11" \\\n    --hash=sha256:aa\n'
        'numpy==2.3 ; python_version >= "3.11" \\\n    --hash=sha256:bb\ntensorflow-cpu==2.21\n'
    )
    _, said = venv_sh(clone)
    assert said.startswith("scripts/venv.sh: installing the 2 pinned packages of requirements/cpu.lock into .venv")


def test_scripts_train_asks_for_the_runtime_only_and_scripts_test_for_the_test_tools():
    assert "\nscripts/venv.sh\n" in (ROOT / "scripts" / "train").read_text()
    assert "\nscripts/venv.sh --test\n" in (ROOT / "scripts" / "test").read_text()


def test_scripts_test_and_invoke_test_run_the_same_fast_tier(tmp_path):
    """And --all is the script's wherever it stands: after a file it is not handed to pytest."""
    import shutil
    import subprocess

    assert f'tier=(-m "{tasks.FAST_TIER}")' in (ROOT / "scripts" / "test").read_text()
    (tmp_path / "scripts").mkdir()
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "test", tmp_path / "scripts" / "test")
    (tmp_path / "scripts" / "venv.sh").write_text("#!/bin/sh\n")
    (tmp_path / ".venv" / "bin" / "python").write_text('#!/bin/sh\nprintf "%s|" "$@"\n')
    for fake in ("scripts/venv.sh", ".venv/bin/python"):
        (tmp_path / fake).chmod(0o755)

    def pytest_args(*args: str) -> list[str]:
        done = subprocess.run(["bash", "scripts/test", *args], cwd=tmp_path, capture_output=True, text=True, check=True)
        return done.stdout.split("|")[:-1]

    assert pytest_args("-n", "0") == ["-m", "pytest", "-n", "auto", "-m", tasks.FAST_TIER, "-n", "0"]
    assert pytest_args("tests/test_config.py", "--all") == ["-m", "pytest", "-n", "auto", "tests/test_config.py"]


def test_a_venv_made_for_training_gets_the_test_tools_and_every_extra_when_scripts_test_uses_it(clone):
    venv_sh(clone)
    pip, said = venv_sh(clone, "--test")
    assert pip == ["--require-hashes -r requirements/store.lock", "--require-hashes -r requirements/test.lock"]
    assert "installing the 1 pinned packages of requirements/test.lock" in said
    assert venv_sh(clone, "--test") == ([], "") and venv_sh(clone) == ([], "")


def test_an_extra_is_installed_on_top_of_the_core_once_and_an_unknown_one_is_refused_naming_them(clone):
    import subprocess

    assert venv_sh(clone, "--extra", "store")[0] == [
        "--require-hashes -r requirements/cpu.lock",
        "--no-deps -e .",
        "--require-hashes -r requirements/store.lock",
    ]
    assert venv_sh(clone, "--extra", "all") == ([], "")
    done = subprocess.run(["bash", "scripts/venv.sh", "--extra", "sotre"], cwd=clone, capture_output=True, text=True)
    assert done.returncode == 2 and "'sotre' is not an extra" in done.stderr and "one of: store or all" in done.stderr


@pytest.mark.parametrize("version, refused", [("3.9.18", True), ("3.14.0", True), ("3.10.4", False), ("3.13.1", False)])
def test_a_python_the_locks_have_no_wheels_for_is_refused_before_pip_and_leaves_no_venv(clone, version, refused):
    """pip would fail on the first package, and the .venv left behind would be reused by every later
    run, whatever PYTHON then says: the version is checked first, against pyproject's requires-python."""
    import shutil
    import subprocess

    shutil.copy(ROOT / "pyproject.toml", clone / "pyproject.toml")
    fake = clone / "fakepython"
    fake.write_text(fake.read_text() + f"printf 'home = /usr/bin\\nversion = {version}\\n' > .venv/pyvenv.cfg\n")
    done = subprocess.run(["bash", "scripts/venv.sh"], cwd=clone, env=venv_env(clone), capture_output=True, text=True)
    assert (done.returncode == 2) == refused, done.stderr
    if not refused:
        return
    assert done.stderr == (
        f"scripts/venv.sh: PYTHON={fake} is Python {version}, which TensorFlow has no wheels for (pyproject.toml: "
        "requires-python >=3.10,<3.14); set PYTHON to a supported one, e.g. PYTHON=python3.12 scripts/train\n"
    )
    assert not (clone / ".venv").exists() and not (clone / "pip.log").exists()
    (clone / ".venv" / "bin").mkdir(parents=True)  # one made before this check existed: kept, and named
    shutil.copy(fake, clone / ".venv" / "bin" / "python")
    (clone / ".venv" / "pyvenv.cfg").write_text(f"version = {version}\n")
    done = subprocess.run(["bash", "scripts/venv.sh"], cwd=clone, env=venv_env(clone), capture_output=True, text=True)
    assert done.returncode == 2 and "scripts/venv.sh: .venv is Python " + version in done.stderr
    assert "delete .venv and run again with PYTHON set to a supported one" in done.stderr


def test_a_python_asked_for_with_a_venv_made_by_another_is_named_not_silently_passed_over(clone):
    """PYTHON makes a new .venv only: asking for 3.12 once .venv holds 3.11 trained in 3.11 without a word."""
    import subprocess

    venv_sh(clone)
    (clone / ".venv" / "pyvenv.cfg").write_text("version = 3.11.2\n")
    other = clone / "python3.12"
    other.write_text("#!/bin/sh\necho 3.12\n")
    other.chmod(0o755)
    env = {**venv_env(clone), "PYTHON": str(other)}
    done = subprocess.run(["bash", "scripts/venv.sh"], cwd=clone, env=env, capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (
        0,
        f"scripts/venv.sh: WARNING: .venv is Python 3.11, made before; PYTHON={other} (Python 3.12) is used only to"
        " make a new .venv: delete .venv and run again to use it\n",
    )
    other.write_text("#!/bin/sh\necho 3.11\n")  # the same version: nothing to say
    done = subprocess.run(["bash", "scripts/venv.sh"], cwd=clone, env=env, capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize("debian", [True, False], ids=["debian", "upstream"])
def test_a_python_without_ensurepip_is_one_line_naming_the_fix_and_leaves_no_venv_a_later_run_reuses(clone, debian):
    """`python3 -m venv` without ensurepip (Debian or Ubuntu without python3-venv) makes .venv, then fails
    putting pip into it. That .venv, python and no pip, would be taken as made by every later run, and
    pip fail in it even once python3-venv is installed: it is removed, and the cause said in one line."""
    import subprocess

    fake = clone / "fakepython"
    good = fake.read_text()
    debian_said = (  # its own words, on stdout
        "The virtual environment was not created successfully because ensurepip is not\navailable.  On "
        "Debian/Ubuntu systems, you need to install the python3-venv\npackage using the following command.\n\n"
        "    apt install python3.11-venv\n\nFailing command: $PWD/.venv/bin/python3\n"
    )
    upstream_said = "Error: Command '['$PWD/.venv/bin/python3', '-m', 'ensurepip', '--upgrade', '--default-pip']' "
    said = (
        f"cat <<EOF\n{debian_said}EOF\n"
        if debian
        else f"cat >&2 <<EOF\n{upstream_said}returned non-zero exit status 1.\nEOF\n"
    )
    fake.write_text(good + said + "exit 1\n")
    done = subprocess.run(["bash", "scripts/venv.sh"], cwd=clone, env=venv_env(clone), capture_output=True, text=True)
    package = "python3.11-venv" if debian else "python3-venv"
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"scripts/venv.sh: PYTHON={fake} cannot put pip into a new .venv (it has no ensurepip): `sudo apt install "
        f"{package}` (Debian/Ubuntu) and run again, or set PYTHON to a Python that has ensurepip\n"
    )
    assert not (clone / ".venv").exists() and not (clone / "pip.log").exists()
    fake.write_text(good)  # python3-venv installed: the next run makes .venv anew and installs into it
    assert venv_sh(clone)[0] == ["--require-hashes -r requirements/cpu.lock", "--no-deps -e ."]


def test_a_venv_without_pip_is_one_line_naming_the_fix_unless_uv_installs(clone):
    """A .venv made by `uv venv` or `--without-pip`: pip failed in it on every run, "No module named pip".
    With every lock installed already (by uv, on PATH then), it is used as it is: `scripts/train` trains."""
    import subprocess

    venv_sh(clone)
    (clone / ".venv" / "bin" / "pip").unlink()
    assert venv_sh(clone) == ([], "")  # nothing to install: pip is not needed
    (clone / "requirements/cpu.lock").write_text("numpy==2.1\n")  # something to install
    done = subprocess.run(["bash", "scripts/venv.sh"], cwd=clone, env=venv_env(clone), capture_output=True, text=True)
    if (clone / "bin" / "uv").exists():  # uv needs no pip in .venv
        assert done.returncode == 0, done.stderr
        return
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "scripts/venv.sh: .venv has no pip (made without it): delete .venv and run again, or put uv on PATH\n"
    )
    assert (clone / ".venv" / "bin" / "python").exists()  # the user's: left as it was


def test_a_changed_runtime_lock_installs_it_again_and_the_test_tools_with_it(clone):
    assert venv_sh(clone, "--test")[0] == [
        "--require-hashes -r requirements/cpu.lock",
        "--no-deps -e .",
        "--require-hashes -r requirements/store.lock",
        "--require-hashes -r requirements/test.lock",
    ]
    with (clone / "requirements/cpu.lock").open("a") as lock:
        lock.write("keras==3.12\n")
    assert venv_sh(clone)[0] == ["--require-hashes -r requirements/cpu.lock", "--no-deps -e ."]
    assert venv_sh(clone, "--test")[0] == [
        "--require-hashes -r requirements/store.lock",
        "--require-hashes -r requirements/test.lock",
    ]
    (clone / "requirements/test.lock").write_text("pytest==9.1\n")
    assert venv_sh(clone, "--test")[0] == ["--require-hashes -r requirements/test.lock"]
    assert venv_sh(clone) == ([], "")


def test_venv_sh_refuses_an_unknown_argument(clone):
    import subprocess

    done = subprocess.run(["bash", "scripts/venv.sh", "--tests"], cwd=clone, capture_output=True, text=True)
    assert done.returncode == 2 and "unknown argument '--tests'" in done.stderr and "--test" in done.stderr
    assert not (clone / ".venv").exists()


def test_serve_runs_the_command_locally_or_the_compose_profile():
    c = ctx()
    tasks.serve(c, run="20240101-000000 x", local=True, port=9000)
    tasks.serve(c, cpu=True, model_name="mnist")
    compose = "HOST_UID=1234 HOST_GID=567 docker compose -f docker-compose.yml -f docker-compose.cpu.yml"
    assert echoed(c) == [
        f"{tasks.PY} -m train serve '20240101-000000 x' --model-name model --port 9000",
        f"SERVE_PORT=8501 SERVE_ARGS='latest --model-name mnist' {compose} --profile serve up serve",
    ]


@pytest.mark.parametrize("port", [0, -1, 65536, 70000])
@pytest.mark.parametrize("task", [tasks.serve, tasks.tensorboard])
def test_a_port_compose_cannot_publish_is_refused_before_docker(task, port):
    c = ctx()
    with pytest.raises(Exit, match=f"^--port {port}: give a port number from 1 to 65535"):
        task(c, port=port)
    assert commands(c) == []


def test_sweep_runs_the_package_command_here_or_n_workers_of_the_compose_profile(tmp_path):
    c = ctx()
    tasks.sweep(c, space="space.toml", local=True, trials=4, storage="postgresql://db/x", args="--epochs 2")
    assert echoed(c) == [f"{tasks.PY} -m train sweep space.toml --trials 4 --epochs 2 --storage postgresql://db/x"]
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "lr.toml").write_text("")
    c = ctx()
    tasks.sweep(c, space=str(tmp_path / "sweeps" / "lr.toml"), workers=3, cpu=True)
    assert echoed(c)[-1] == (
        f"SWEEP_SPACE=lr.toml HOST_UID=1234 HOST_GID=567 docker compose {tasks.CPU_COMPOSE} "
        "--profile sweep up --detach --scale sweep=3 sweep"
    )
    (tmp_path / "elsewhere.toml").write_text("")
    with pytest.raises(Exit, match="must be in ./sweeps"):
        tasks.sweep(ctx(), space=str(tmp_path / "elsewhere.toml"))
    for missing in (tmp_path / "sweeps" / "nosuch.toml", tmp_path / "nosuch.toml"):
        with pytest.raises(Exit, match=f"^{re.escape(str(missing))}: no such file; write one like sweeps/example.toml"):
            tasks.sweep(ctx(), space=str(missing))


def test_sweep_local_refuses_a_worker_count_it_would_drop():
    c = ctx()
    with pytest.raises(
        Exit, match=r"^--workers 3 is for the compose profile: with --local, run `invoke sweep s.toml --local`"
    ):
        tasks.sweep(c, space="s.toml", local=True, workers=3)
    assert commands(c) == []


def test_settings_files_writes_env_example_and_replaces_only_the_readme_table(tmp_path):
    (tmp_path / "README.md").write_text(
        "# T\n\n<!-- settings-table:start (generated) -->\n\n| old |\n\n<!-- settings-table:end -->\n\nafter\n"
    )
    settings = f"{tasks.PY} -m train settings --format"
    c = ctx(**{f"{settings} env-example": Result("# EPOCHS=3\n"), f"{settings} table": Result("| `EPOCHS` |\n")})
    tasks.settings_files(c)
    assert (tmp_path / ".env.example").read_text() == "# EPOCHS=3\n"
    assert (tmp_path / "README.md").read_text() == (
        "# T\n\n<!-- settings-table:start (generated) -->\n\n| `EPOCHS` |\n\n<!-- settings-table:end -->\n\nafter\n"
    )


def test_settings_files_that_cannot_write_one_file_writes_neither(tmp_path):
    readme = "<!-- settings-table:start -->\n\n| old |\n\n<!-- settings-table:end -->\n"
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / ".env.example").mkdir()  # stands for a read-only file (root may write those)
    settings = f"{tasks.PY} -m train settings --format"
    c = ctx(**{f"{settings} env-example": Result("# EPOCHS=3\n"), f"{settings} table": Result("| `EPOCHS` |\n")})
    with pytest.raises(Exit, match=r"\.env\.example: Is a directory; make it writable \(nothing was written\)$"):
        tasks.settings_files(c)
    assert (tmp_path / "README.md").read_text() == readme


def test_settings_files_without_the_markers_says_so_and_writes_nothing(tmp_path):
    (tmp_path / "README.md").write_text("# T\n| old |\n")
    with pytest.raises(Exit, match="no settings table between .* put the two markers back"):
        tasks.settings_files(ctx())
    assert not (tmp_path / ".env.example").exists()
    assert (tmp_path / "README.md").read_text() == "# T\n| old |\n"


def test_settings_files_with_refused_settings_names_them_and_writes_nothing(tmp_path):
    (tmp_path / "README.md").write_text("<!-- settings-table:start -->\n\n| old |\n\n<!-- settings-table:end -->\n")
    refused = Result(stderr="ConfigError: EPOCHS=0 is not valid: must be at least 1\n", exited=2)
    with pytest.raises(Exit, match=r"^python -m train settings: ConfigError: EPOCHS=0 .*; nothing was written$"):
        tasks.settings_files(ctx(**{f"{tasks.PY} -m train settings --format env-example": refused}))
    assert not (tmp_path / ".env.example").exists()


def test_a_word_for_a_number_option_is_one_line_naming_the_option(monkeypatch, capsys):
    """invoke int()s a number option while it parses: `--workers abc` ended in its traceback."""
    from invoke.parser import Argument

    passed_on = []
    monkeypatch.setattr(tasks, "_other_errors", lambda *exc: passed_on.append(exc[0]))
    for argv in (["invoke", "train", "--workers", "abc"], ["invoke", "train", "--workers=abc"]):
        monkeypatch.setattr(tasks.sys, "argv", argv)
        with pytest.raises(ValueError) as info:
            Argument(name="workers", kind=int).value = "abc"
        tasks._number_refused(ValueError, info.value, info.tb)
        assert (
            capsys.readouterr().err == "--workers 'abc': give a whole number (invoke --help TASK lists the options)\n"
        )
    try:
        int("abc")  # the same error from anywhere else keeps Python's traceback
    except ValueError as error:
        tasks._number_refused(ValueError, error, error.__traceback__)
    assert passed_on == [ValueError] and capsys.readouterr().err == ""


def test_importing_the_tasks_leaves_the_importers_sigterm_alone():
    """Only invoke's own process hands a SIGTERM on as a Ctrl-C: a pytest worker that imported tasks.py
    turned the next test's SIGTERM into a KeyboardInterrupt that ended the whole session."""
    import signal

    import tasks

    assert signal.getsignal(signal.SIGTERM) is not tasks._terminated
