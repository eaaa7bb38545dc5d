"""invoke tasks: the commands a user types, assembled and echoed; the logic lives in `train/`.

    invoke --list            every task;  invoke --help TASK   its arguments
    invoke build             image tagged with the lock hash and the git commit (--target cpu)
    invoke train             train in the container with the GPU and the volumes (--cpu, --local)

Container tasks check their preconditions first (Docker, the NVIDIA runtime, a GPU) and stop with
one line that says what is missing and what to do. Tested with invoke.MockContext (tests/test_tasks.py).
A task's first docstring line is what `invoke --list` shows: one sentence of at most 60 characters.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path

from invoke import Collection, Context, Exit, task

ROOT = Path(__file__).resolve().parent
IMAGE = "tf-train-template"  # the image's name when IMAGE is set neither in the environment nor in .env
REQ = "requirements"  # every .in file and its lock
LOCKS = {"cpu": f"{REQ}/cpu.lock", "gpu": f"{REQ}/gpu.lock"}
# The optional parts with packages of their own: requirements/<name>.in, its lock, pip install -e .[name].
EXTRAS = ("serve", "mlflow", "sweep", "store", "onnx")
CPU_COMPOSE = "-f docker-compose.yml -f docker-compose.cpu.yml"
MULTIWORKER_COMPOSE = "-f docker-compose.multiworker.yml"
MULTIWORKER_SERVICES = 2  # worker0 and worker1 in docker-compose.multiworker.yml
CPU_HINT = f"or add --cpu (the CPU image; without invoke: docker compose {CPU_COMPOSE} ...)"
TOOLKIT_URL = "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html"
PY = shlex.quote(sys.executable)  # the interpreter invoke runs in: the project's venv


def _number_refused(kind, error, tb) -> None:
    """invoke casts a number option's text with int() while it parses the command line, and a word there
    (`--workers abc`) ends in its traceback: said in one line instead, naming the option (exit 1)."""
    frames = [f.filename for f in traceback.extract_tb(tb)]
    if kind is ValueError and any(f.endswith(os.path.join("invoke", "parser", "argument.py")) for f in frames):
        bad = re.search(r"'(.*)'$", str(error))
        value = bad.group(1) if bad else "?"
        given = [a for a, b in zip(sys.argv, sys.argv[1:]) if b == value and a.startswith("-")]
        given += [a.split("=", 1)[0] for a in sys.argv if a.startswith("-") and a.endswith(f"={value}")]
        option = given[0] if given else "an option"
        print(f"{option} {value!r}: give a whole number (invoke --help TASK lists the options)", file=sys.stderr)
        return
    _other_errors(kind, error, tb)


_other_errors, sys.excepthook = sys.excepthook, _number_refused


def _terminated(signum, frame) -> None:
    """invoke hands a Ctrl-C on to the command it runs (training stops and saves), but a SIGTERM (`kill`,
    a cancelled CI job, systemd) ends invoke itself, and the command's terminal with it: the training
    then dies of SIGHUP without saving, its manifest left `running`. A SIGTERM is handed on as a Ctrl-C."""
    raise KeyboardInterrupt


# Only in invoke's own process: a program that imports this file (the tests) keeps its SIGTERM.
if Path(sys.argv[0]).name in ("invoke", "inv") or Path(sys.argv[0]).parent.name == "invoke":  # or python -m invoke
    signal.signal(signal.SIGTERM, _terminated)


# --- preconditions -------------------------------------------------------------------------------


def _require_docker(c: Context, local: bool = True) -> None:
    """`local`: the task has --local (on this host, without Docker), which either refusal then names."""
    or_local = ", or use --local" if local else ""
    if shutil.which("docker") is None:
        raise Exit(
            f"Docker is not installed: install Docker Engine (https://docs.docker.com/engine/install/){or_local}"
        )
    if not c.run("docker info --format '{{.ServerVersion}}'", hide=True, warn=True).ok:
        raise Exit(
            "the Docker engine is not reachable: start it (sudo systemctl start docker) and make sure "
            f"you may use it (sudo usermod -aG docker $USER, then log in again){or_local}"
        )


def _require_gpu(c: Context) -> None:
    """The NVIDIA container toolkit on Docker, and a driver that sees a GPU on this host."""
    runtimes = c.run("docker info --format '{{json .Runtimes}}'", hide=True, warn=True).stdout
    if "nvidia" not in runtimes and shutil.which("nvidia-container-runtime-hook") is None:
        raise Exit(
            f"the NVIDIA container toolkit is not set up for Docker: install it ({TOOLKIT_URL}), "
            f"run `sudo nvidia-ctk runtime configure --runtime=docker` and restart Docker; {CPU_HINT}"
        )
    if shutil.which("nvidia-smi") is None or "GPU" not in c.run("nvidia-smi -L", hide=True, warn=True).stdout:
        try:  # the driver the locked CUDA needs, from the optional GPU check's table
            from train.gpucheck.stack import GPU_LOCK, locked_versions, stack_for
        except ModuleNotFoundError:
            need = "that supports the CUDA of requirements/gpu.lock"
        else:
            stack = stack_for(locked_versions(GPU_LOCK)["tensorflow"])
            need = f">= {stack.min_driver} (>= {stack.ptx_driver} for H100, H200 and newer GPUs)"
        raise Exit(
            f"no NVIDIA GPU found on this host (`nvidia-smi -L` lists none): install the NVIDIA driver "
            f"{need}; {CPU_HINT}"
        )


def _compose(c: Context, cpu: bool, gpu_needed: bool = True, local: bool = True) -> str:
    """Check what the compose command needs; return it with the host user's ids in front."""
    _require_docker(c, local)
    files = _compose_setting("COMPOSE_FILE")
    chosen = _adds_cpu_file(files)
    if not (cpu or chosen) and gpu_needed:
        _require_gpu(c)
    env = f"HOST_UID={os.getuid()} HOST_GID={os.getgid()}"  # compose cannot see the shell's $UID
    if not cpu or chosen:  # COMPOSE_FILE that names the CPU file: compose adds it itself
        return f"{env} docker compose"
    if files is not None:  # a -f would replace COMPOSE_FILE's list (and the user's overrides in it): extend it
        separator = os.environ.get("COMPOSE_PATH_SEPARATOR", os.pathsep)
        return f"COMPOSE_FILE={shlex.quote(files + separator + 'docker-compose.cpu.yml')} {env} docker compose"
    return f"{env} docker compose {CPU_COMPOSE}"


def _compose_setting(name: str) -> str | None:
    """A variable as docker compose reads it here: the environment, else .env; None when neither sets it."""
    value = os.environ.get(name)
    if value is None and (ROOT / ".env").is_file():
        from train.errors import TemplateError
        from train.setup.envfile import read_env_file

        try:
            value = read_env_file(ROOT / ".env", ()).get(name)
        except TemplateError as exc:  # not UTF-8, a line that is not NAME=value: one line, not a traceback
            raise Exit(f"{type(exc).__name__}: {exc}") from None
    return value or None


def _adds_cpu_file(files: str | None) -> bool:
    """Whether a COMPOSE_FILE list adds the CPU file: the README's quick start puts it in .env on a host
    without a GPU, and that is --cpu's choice."""
    separator = os.environ.get("COMPOSE_PATH_SEPARATOR", os.pathsep)
    return any(Path(name).name == "docker-compose.cpu.yml" for name in (files or "").split(separator))


def _cpu_by_compose_file() -> bool:
    return _adds_cpu_file(_compose_setting("COMPOSE_FILE"))


def _words(option: str, text: str) -> str:
    """`text` split like a shell would, each word quoted again: c.run hands its line to a shell, and a `;`,
    `|` or `$(...)` in --args must reach the command as an argument, never run as a shell command."""
    try:
        return shlex.join(shlex.split(text))
    except ValueError as error:  # shlex: "No closing quotation", "No escaped character"
        raise Exit(f"{option} {text!r}: {error}: close the quote, or escape it with a backslash") from None


def _at_least_one(option: str, value: int) -> None:
    """A count of processes: below 1, compose would scale to none and train --local would start one."""
    if value < 1:
        raise Exit(f"{option} {value}: give 1 or more")


def _published(port: int) -> int:
    """A port compose publishes on 127.0.0.1: with 0 Docker would pick one that the task cannot print."""
    if not 1 <= port <= 65535:
        raise Exit(f"--port {port}: give a port number from 1 to 65535 (--local takes 0: any free port)")
    return port


def _volumes() -> None:
    # Created here, as you, so the daemon does not create them as root (compose refuses missing ones).
    for name in ("runs", "data"):
        (ROOT / name).mkdir(exist_ok=True)


# --- image ---------------------------------------------------------------------------------------


def git_commit(c: Context) -> tuple[str, bool]:
    """The checked-out commit ("" outside a git checkout) and whether tracked files differ from it."""
    result = c.run("git rev-parse HEAD", hide=True, warn=True)
    if not (result.ok and result.stdout.strip()):
        return "", False
    dirty = c.run("git status --porcelain --untracked-files=no", hide=True, warn=True)
    return result.stdout.strip(), bool(dirty.ok and dirty.stdout.strip())


def image_tag(target: str, commit: str, dirty: bool) -> str:
    """`<target>-<first 12 hex of the lock's sha256>-<commit>[-dirty]`: which deps and which code."""
    lock_hash = hashlib.sha256((ROOT / LOCKS[target]).read_bytes()).hexdigest()[:12]
    return f"{target}-{lock_hash}-{commit[:8] or 'nogit'}{'-dirty' if dirty else ''}"


@task(
    help={
        "target": "gpu (CUDA wheels, default) or cpu (tensorflow-cpu, no CUDA download; the default when "
        "COMPOSE_FILE adds docker-compose.cpu.yml)",
        "uid": "user id of the image's default user (default 1000; compose runs as your HOST_UID anyway)",
        "gid": "group id of the image's default user (default 1000)",
        "base_image": "replace the Dockerfile's pinned base image (a mirror or an internal image)",
        "ca_bundle": "PEM file of extra CA certificates, passed as a BuildKit secret (TLS-intercepting proxies)",
        "network": "build network, e.g. host when the default bridge has no route out",
        "no_cache": "rebuild every layer (the pip download cache mount is still used)",
    }
)
def build(c, target="", uid=1000, gid=1000, base_image="", ca_bundle="", network="", no_cache=False):
    """Build the image, tagged with its lock's hash and the commit.

    Tags IMAGE:<target> and IMAGE:<target>-<lock hash>-<commit>."""
    target = target or ("cpu" if _cpu_by_compose_file() else "gpu")  # the image compose will run
    if target not in LOCKS:
        raise Exit(f"--target {target!r} is not valid: gpu or cpu")
    if ca_bundle and not Path(ca_bundle).is_file():
        raise Exit(f"--ca-bundle {ca_bundle!r} is not a file: give the path of a PEM bundle")
    _require_docker(c, local=False)
    commit, dirty = git_commit(c)
    args = ["--target runtime", f"--build-arg VARIANT={target}", f"--build-arg UID={uid}", f"--build-arg GID={gid}"]
    if commit:  # baked into the image as BUILD_COMMIT, recorded in every run's manifest
        args.append(f"--build-arg GIT_COMMIT={commit}")
    if base_image:
        args.append(f"--build-arg BASE_IMAGE={shlex.quote(base_image)}")
    if ca_bundle:
        args.append(f"--secret id=ca_bundle,src={shlex.quote(ca_bundle)}")
    if network:
        args.append(f"--network {shlex.quote(network)}")
    if no_cache:
        args.append("--no-cache")
    image = _compose_setting("IMAGE") or IMAGE  # the name compose runs (${IMAGE:-tf-train-template})
    tags = f"-t {image}:{target} -t {image}:{image_tag(target, commit, dirty)}"
    c.run(f"DOCKER_BUILDKIT=1 docker build {' '.join(args)} {tags} .", echo=True, pty=True)


# --- running -------------------------------------------------------------------------------------


@task(
    help={
        "local": "run the check on this host, in the current Python environment",
        "cpu": "use the CPU image (reports why no GPU is used, without needing one)",
    }
)
def gpu_check(c, local=False, cpu=False):
    """Diagnose the GPU set-up; exits 1 if no GPU is usable.

    Runs `python -m train check --require-gpu` in the image, or on this host with --local; with the CPU
    image (--cpu, or COMPOSE_FILE naming docker-compose.cpu.yml) it reports why no GPU is used and
    requires none."""
    if local:
        c.run(f"{PY} -m train check --require-gpu", echo=True, pty=True)
        return
    _volumes()
    cpu = cpu or _cpu_by_compose_file()
    c.run(f"{_compose(c, cpu)} run --rm train check" + ("" if cpu else " --require-gpu"), echo=True, pty=True)


@task(
    help={
        "local": "train on this host, in the current Python environment, instead of the container",
        "detach": "return at once and keep training in the background (follow with `invoke logs -f`)",
        "cpu": "use the CPU image and no GPU reservation (docker-compose.cpu.yml)",
        "args": 'extra arguments for `python -m train fit`, e.g. "--epochs 5 --model cnn_bn"',
        "workers": "train with N worker processes on this host (MultiWorkerMirroredStrategy; with --local up to "
        "the host's cores, else the 2 services of docker-compose.multiworker.yml)",
    }
)
def train(c, local=False, detach=False, cpu=False, args="", workers=1):
    """Train with .env's settings, in the container with the GPU.

    The settings from .env plus --args; the container gets the GPU and the runs/ and data/ volumes."""
    args = _words("--args", args)
    _at_least_one("--workers", workers)
    _volumes()
    if workers > 1:
        _train_workers(c, workers, local, detach, args)
        return
    if local:
        cmd = f"{PY} -m train fit {args}".rstrip()
        if detach:  # a plain `nohup ... &`: survives the terminal; the run's own log is train.log
            out = _nohup_out()
            try:
                (ROOT / out).parent.mkdir(parents=True, exist_ok=True)  # the shell's >> makes no folder
            except OSError as exc:
                raise Exit(f"cannot write {out} (RUNS_DIR): {exc.strerror}; point RUNS_DIR at a folder") from None
            # Appended, not truncated: a second detached run would otherwise cut the file under the
            # first, whose next lines land after a run of NUL bytes, and lose the earlier output.
            c.run(f"nohup {cmd} >> {shlex.quote(str(out))} 2>&1 &", echo=True, disown=True)
            print("training in the background; follow it with: invoke logs --local -f")
        else:
            c.run(cmd, echo=True, pty=True)
        return
    # `up` (not `run`): one named service container, so `invoke logs -f` and `docker compose stop`
    # find it; TRAIN_ARGS is appended to its `fit` command by docker-compose.yml.
    extra = f"TRAIN_ARGS={shlex.quote(args)} " if args else ""
    commit, _ = git_commit(c)
    if commit:  # compose builds the image when it is missing: the commit must reach BUILD_COMMIT then too
        extra += f"GIT_COMMIT={commit} "
    mode = "--detach" if detach else "--exit-code-from train"  # without it, compose exits 0 whatever happened
    c.run(f"{extra}{_compose(c, cpu)} up {mode} train", echo=True, pty=not detach)
    if detach:
        print("training in the background; follow it with: invoke logs -f; stop (and save) with: docker compose stop")


def _nohup_out() -> Path:
    """Where `train --local --detach` appends its console output and `logs --local` reads it: nohup.out in
    RUNS_DIR as `python -m train` here reads it (the environment, else .env), beside the runs. A RUNS_DIR
    in object storage (s3://...) is no folder a shell can append to: ./runs on this machine then."""
    from train.locations import looks_like_url

    runs_dir = _runs_dir()
    return Path("runs" if looks_like_url(runs_dir) else runs_dir).expanduser() / "nohup.out"


def _runs_dir() -> str:
    """RUNS_DIR as `python -m train` here reads it: the environment, else .env."""
    from train.config import load_settings
    from train.errors import TemplateError

    env_file = ROOT / ".env"
    try:
        # The .env file's warnings (an unknown name) are the fit's to say, once.
        quiet = {"warn": lambda _line: None, "only": {"runs_dir"}}
        settings = load_settings(env_file=env_file if env_file.is_file() else None, **quiet)
    except TemplateError as exc:
        raise Exit(f"{type(exc).__name__}: {exc}") from None
    return settings.runs_dir


def free_ports(n: int) -> list[int]:
    """n TCP ports free on 127.0.0.1 right now (the workers bind them a moment later)."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _fits_this_host(n: int) -> None:
    """Local workers are one TensorFlow process each (threads, memory): past this host's cores they
    only share them, and a typo (`--workers 20` for 2) would start that many at once."""
    from train.training.flops import usable_cpus  # the machine's count where no affinity is known (macOS)

    cores = usable_cpus() or 1
    most = max(2, cores)  # two workers try the several-machines path even on one core
    if n > most:
        raise Exit(
            f"--workers {n}: more TensorFlow processes than this host's {cores} core{'s' * (cores != 1)} can run; give at "
            f"most {most}, or start the workers on several machines (docs/distributed.md)"
        )


def _train_workers(c: Context, n: int, local: bool, detach: bool, args: str) -> None:
    """Several workers on this host: local processes, or the multi-worker compose file."""
    from importlib.util import find_spec

    if find_spec("train.workers") is None:
        raise Exit("--workers needs the workers extra (train/workers/ and its line in train/extras.py), gone here")
    if detach:
        raise Exit("--workers and --detach: start the workers in the foreground (Ctrl-C stops and saves them all)")
    if local:
        _fits_this_host(n)
        addresses = ",".join(f"127.0.0.1:{p}" for p in free_ports(n))
        fit = f"{PY} -m train fit {args}".rstrip()
        # Workers 1..n-1 in the background (their lines carry "[worker i]"), the chief in the
        # foreground; the exit code is the chief's. A stop asked of any worker stops them all.
        others = " ".join(f"WORKERS={addresses} WORKER_INDEX={i} {fit} &" for i in range(1, n))
        c.run(f"{others} WORKERS={addresses} WORKER_INDEX=0 {fit}; rc=$?; wait; exit $rc", echo=True, pty=True)
        return
    if n != MULTIWORKER_SERVICES:
        raise Exit(
            f"docker-compose.multiworker.yml defines {MULTIWORKER_SERVICES} workers, not {n}: use --local for "
            "another count, or add services to the file (its header says how)"
        )
    _require_docker(c)
    extra = f"TRAIN_ARGS={shlex.quote(args)} " if args else ""
    ids = f"HOST_UID={os.getuid()} HOST_GID={os.getgid()}"
    c.run(f"{extra}{ids} docker compose {MULTIWORKER_COMPOSE} up --exit-code-from worker0", echo=True, pty=True)


@task(
    help={
        "run": "run id, run directory or 'latest' (default)",
        "local": "export on this host instead of in the container",
        "cpu": "use the CPU image and no GPU reservation",
    }
)
def export(c, run="latest", local=False, cpu=False):
    """Export a run's best weights (SavedModel, .keras, labels).

    Runs `python -m train export RUN`."""
    if local:
        c.run(f"{PY} -m train export {shlex.quote(run)}", echo=True, pty=True)
        return
    _volumes()
    c.run(f"{_compose(c, cpu)} run --rm train export {shlex.quote(run)}", echo=True, pty=True)


@task(
    help={
        "run": "run id, run directory or 'latest' (default)",
        "local": "write it on this host instead of in the container",
        "cpu": "use the CPU image and no GPU reservation",
        "quick": "curves and summary only (no data loading, no predictions)",
    }
)
def report(c, run="latest", local=False, cpu=False, quick=False):
    """Write a run's report.html and curves.png again.

    Runs `python -m train report RUN`."""
    args = f"report {shlex.quote(run)}" + (" --quick" if quick else "")
    if local:
        c.run(f"{PY} -m train {args}", echo=True, pty=True)
        return
    _volumes()
    c.run(f"{_compose(c, cpu)} run --rm train {args}", echo=True, pty=True)


@task(
    help={
        "runs": 'two or more run ids or directories, split like a shell would, e.g. "RUN_A RUN_B"',
        "out": "also write the overlaid curves: a .png, or an .html page with the tables",
    }
)
def compare(c, runs, out=""):
    """Compare runs on this host (no container, no TensorFlow).

    Runs `python -m train compare RUN RUN ...`."""
    c.run(
        f"{PY} -m train compare {_words('--runs', runs)}" + (f" --out {shlex.quote(out)}" if out else ""),
        echo=True,
        pty=True,
    )


@task(
    help={
        "follow": "keep printing new lines (-f)",
        "local": "show RUNS_DIR/nohup.out of `invoke train --local --detach` instead of the container's log",
        "cpu": "the training was started with --cpu",
    }
)
def logs(c, follow=False, local=False, cpu=False):
    """Show the log of the training started with --detach."""
    if local:
        out = _nohup_out()
        if not (ROOT / out).is_file():
            raise Exit(f"{out} does not exist: no training was started here with `invoke train --local --detach`")
        c.run(f"tail -n 100 {'-f ' if follow else ''}{shlex.quote(str(out))}", echo=True, pty=True)
        return
    c.run(f"{_compose(c, cpu, gpu_needed=False)} logs {'-f ' if follow else ''}train".rstrip(), echo=True, pty=True)


@task(
    help={
        "local": "run TensorBoard on this host (foreground) instead of in a container",
        "port": "port on 127.0.0.1 (default 6006)",
        "cpu": "use the CPU image",
        "stop": "stop the TensorBoard container",
    }
)
def tensorboard(c, local=False, port=6006, cpu=False, stop=False):
    """Serve TensorBoard for every run in RUNS_DIR.

    On http://127.0.0.1:PORT: this machine only (TensorBoard has no authentication)."""
    if local:
        from train.locations import looks_like_url

        runs_dir = _runs_dir()
        if looks_like_url(runs_dir):
            raise Exit(
                f"RUNS_DIR {runs_dir} is in object storage, which TensorBoard cannot read: set RUNS_DIR to a "
                "folder for this command (the runs trained on this machine are in STORE_CACHE: docs/storage.md)"
            )
        logdir = shlex.quote(str(Path(runs_dir).expanduser()))
        c.run(f"{PY} -m tensorboard.main --logdir {logdir} --host 127.0.0.1 --port {int(port)}", echo=True, pty=True)
        return
    port = _published(port)
    _volumes()
    compose = _compose(c, cpu, gpu_needed=False)
    if stop:
        c.run(f"{compose} stop tensorboard", echo=True)
        return
    c.run(f"TENSORBOARD_PORT={int(port)} {compose} up --detach tensorboard", echo=True)
    print(f"TensorBoard: http://127.0.0.1:{int(port)}  (stop it with: invoke tensorboard --stop)")


@task(
    help={
        "run": "run id, run directory, export folder or 'latest' (default)",
        "local": "serve on this host instead of in the container",
        "port": "port on 127.0.0.1 (default 8501)",
        "model_name": "the name in the URLs, /v1/models/NAME (default model)",
        "cpu": "use the CPU image",
    }
)
def serve(c, run="latest", local=False, port=8501, model_name="model", cpu=False):
    """Serve a run's export over HTTP on 127.0.0.1:PORT.

    Runs `python -m train serve RUN`; in the container, the compose profile `serve` (docs/serving.md)."""
    args = f"{shlex.quote(run)} --model-name {shlex.quote(model_name)}"
    if local:
        c.run(f"{PY} -m train serve {args} --port {int(port)}", echo=True, pty=True)
        return
    port = _published(port)
    _volumes()
    compose = _compose(c, cpu, gpu_needed=False)
    c.run(
        f"SERVE_PORT={int(port)} SERVE_ARGS={shlex.quote(args)} {compose} --profile serve up serve", echo=True, pty=True
    )


# --- development ---------------------------------------------------------------------------------


# The fast tier, as scripts/test runs it by default; --all adds the slow, gpu, docker and bench tests.
FAST_TIER = "not slow and not gpu and not docker and not bench"


@task(
    help={
        "args": 'extra pytest arguments, after the task\'s own, e.g. "tests/test_config.py" or "-n 0"',
        "all": "every test (CI's run), not only the fast tier",
    }
)
def test(c, args="", all=False):
    """Run the fast tests, one worker per core (--all: all).

    Runs `python -m pytest -q -n auto -m "<fast tier>"`, or without the -m with --all."""
    tier = "" if all else f" -m {shlex.quote(FAST_TIER)}"
    c.run(f"{PY} -m pytest -q -n auto{tier} {_words('--args', args)}".rstrip(), echo=True, pty=True)


@task(
    help={
        "json": "where to write pytest-benchmark's JSON report (the ratio table is read from it)",
        "args": 'extra pytest arguments, e.g. "-k pipeline"',
        "quick": "tiny data and budgets (about 3 minutes on 2 cores): checks that the benchmarks run; the ratios mean nothing",
    }
)
def bench(c, json=".benchmarks/latest.json", args="", quick=False):
    """Run the benchmarks (benchmarks/) and print their ratios.

    pytest-benchmark's timing tables first, then benchmarks/summarise.py's table of the ratios
    against the reference recipe (the one in docs/performance.md), from the JSON report."""
    args = _words("--args", args)
    report = Path(json)
    _writable_folder("--json", report)
    before = report.stat().st_mtime_ns if report.is_file() else None
    flags = " --bench-quick" if quick else ""
    result = c.run(
        f"{PY} -m pytest benchmarks/ --benchmark-enable --benchmark-json {shlex.quote(json)}{flags} {args}".rstrip(),
        echo=True,
        pty=True,
        warn=True,
    )
    # Also after a failed benchmark: the others' ratios are in the report. An old report is not shown.
    if report.is_file() and report.stat().st_mtime_ns != before:
        c.run(f"{PY} benchmarks/summarise.py {shlex.quote(json)}", echo=True)
        if quick:
            print("--quick: tiny data, so these ratios only show that the benchmarks run")
    if not result.ok:
        raise Exit(code=result.exited)


def _writable_folder(option: str, path: Path) -> None:
    """Make `path`'s folder and write a file in it: a report that cannot be written should stop the task
    before minutes of benchmarks, not after them (pytest-benchmark then ends in a traceback)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path.parent).close()
    except OSError as error:
        raise Exit(
            f"{option} {str(path)!r}: cannot write in {path.parent} ({error.strerror}): give a folder you can write"
        ) from None


MUTMUT = "mutmut==3.8.1"
MUTATE_VENV = ".venv-mutmut"


def _module_or_package(name: str) -> bool:
    path = ROOT / "train" / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or path.is_dir()


def _mutated_paths() -> list[str] | None:
    """only_mutate of [tool.mutmut] in pyproject.toml (None without one, or on Python 3.10)."""
    try:
        import tomllib
    except ModuleNotFoundError:
        return None
    pyproject = ROOT / "pyproject.toml"
    if not pyproject.is_file():
        return None
    return tomllib.loads(pyproject.read_text()).get("tool", {}).get("mutmut", {}).get("only_mutate")


def _dotted(path: str) -> str:
    """train/run/rundir.py -> run.rundir"""
    return path.removeprefix("train/").removesuffix(".py").replace("/", ".")


def _covers(name: str, path: str) -> bool:
    """The module `name` is `path`, or the package `name` holds it."""
    dotted = _dotted(path)
    return dotted == name or dotted.startswith(name + ".")


def _mutmut(c: Context) -> str:
    """mutmut in its own venv (.venv-mutmut/), created on first use. It sees this environment's
    packages through a .pth file: TensorFlow is not installed twice, and the locks stay as they are."""
    import sysconfig

    venv = ROOT / MUTATE_VENV
    exe = venv / "bin" / "mutmut"
    if not exe.is_file():
        c.run(f"{PY} -m venv {shlex.quote(str(venv))}", echo=True)
        site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
        site.mkdir(parents=True, exist_ok=True)
        (site / "project-venv.pth").write_text(sysconfig.get_path("purelib") + "\n")
        c.run(f"{shlex.quote(str(venv / 'bin' / 'python'))} -m pip install -q {shlex.quote(MUTMUT)}", echo=True)
    return shlex.quote(str(exe))


@task(
    help={
        "modules": "comma-separated modules or packages of train/ to mutate now, e.g. run.rundir,reproduce (default: all configured)",
        "workers": "parallel test processes (default 1: kind to a shared machine)",
        "results": "only list the surviving mutants of the last run (`mutmut show NAME` shows one)",
    }
)
def mutate(c, modules="", workers=1, results=False):
    """Mutation testing of train/ with the fast tests (not in CI).

    The modules and tests are configured in [tool.mutmut] in pyproject.toml."""
    _at_least_one("--workers", workers)
    # run.rundir; also as mutmut names it (train.run.rundir) or as only_mutate does (train/run/rundir.py)
    wanted = [_dotted(m.strip()).removeprefix("train.") for m in modules.split(",") if m.strip()]
    if modules.strip() and not wanted:  # "," or " , ": not the empty default, which mutates everything
        raise Exit(
            f"--modules {modules!r} names no module: give names such as run.rundir,reproduce, or leave it out for all"
        )
    unknown = [m for m in wanted if not _module_or_package(m)]
    if unknown:
        path = unknown[0].replace(".", "/")
        raise Exit(
            f"--modules {modules!r}: no train/{path}.py or train/{path}/; give module or package names "
            "such as run.rundir,run.checkpoints or reproduce"
        )
    configured = _mutated_paths()
    if configured is not None:
        # mutmut stops with a bare AssertionError when a name matches none of its mutants.
        left_out = [m for m in wanted if not any(_covers(m, path) for path in configured)]
        if left_out:
            raise Exit(
                f"--modules {modules!r}: train/{left_out[0].replace('.', '/')} is not mutated; add it to "
                "only_mutate in [tool.mutmut] of pyproject.toml, or give one of: "
                + ",".join(_dotted(path) for path in configured)
            )
    mutmut = _mutmut(c)
    if results:
        c.run(f"{mutmut} results", echo=True, pty=True)
        return
    names = " ".join(shlex.quote(f"train.{m}.*") for m in wanted)
    c.run(f"{mutmut} run --max-children {int(workers)} {names}".rstrip(), echo=True, pty=True)


def _normal(name: str) -> str:
    """A package name as the locks compare it (PEP 503): Typing_Extensions is typing-extensions."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _check_locked(package: str) -> None:
    """uv's --upgrade-package takes a name that no lock holds without a word: every lock would be compiled
    again (minutes, on the network), nothing upgraded, and the task end with exit 0."""
    locks = sorted((ROOT / REQ).glob("*.lock"))
    pinned = {_normal(m) for lock in locks for m in re.findall(r"^([A-Za-z0-9][\w.-]*)==", lock.read_text(), re.M)}
    name = _normal(re.split(r"[<>=!~;\[ ]", package, maxsplit=1)[0])  # uv also takes "numpy<2"
    if locks and name not in pinned:
        close = difflib.get_close_matches(name, sorted(pinned), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise Exit(
            f"--package {package!r} is in none of the locks ({REQ}/*.lock): {hint}a new package goes into a .in "
            "file first, then `invoke lock`"
        )


@task(
    help={
        "upgrade": "move every package to the newest version the inputs allow (default: keep current pins)",
        "package": "upgrade only this package (uv's --upgrade-package), e.g. numpy",
    }
)
def lock(c, upgrade=False, package=""):
    """Regenerate every lock file from its .in file.

    all.lock first (GPU TensorFlow, the core and every extra resolved together), then the locks held
    to it: gpu.lock and cpu.lock (the core), test.lock and each extra's; then the tools that live in
    environments of their own: mlflow-server.lock, skypilot.lock, runtime-check.lock and dvc.lock."""
    if package:
        _check_locked(package)
    if shutil.which("uv") is None:
        raise Exit("uv is not installed: `pip install uv` (it resolves one lock for Python 3.10-3.13)")
    flags = "--universal --python-version 3.10 --generate-hashes --custom-compile-command 'invoke lock' -q"
    if upgrade:
        flags += " --upgrade"
    if package:
        flags += f" --upgrade-package {shlex.quote(package)}"
    c.run(f"uv pip compile {REQ}/all.in {flags} -o {REQ}/all.lock", echo=True)
    # Held to all.lock: any of these installed together (the core's and an extra's) agree on every version.
    for name in ("gpu", "cpu", "test", *EXTRAS):
        c.run(f"uv pip compile {REQ}/{name}.in -c {REQ}/all.lock {flags} -o {REQ}/{name}.lock", echo=True)
    # Tools in their own environments, never beside TensorFlow: the MLflow server of the tracking tests
    # (scripts/venv-mlflow-server.sh), SkyPilot's parser (scripts/venv-skypilot.sh), and LiteRT's and ONNX
    # Runtime's check of the exported files, without TensorFlow (scripts/venv-runtime-check.sh), and the
    # dvc command of the data-versions extra (scripts/venv-dvc.sh).
    for name in ("mlflow-server", "skypilot", "runtime-check", "dvc"):
        c.run(f"uv pip compile {REQ}/{name}.in {flags} -o {REQ}/{name}.lock", echo=True)
    if importlib.util.find_spec("train.gpucheck") is not None:  # the optional GPU check holds TF's tested stack
        c.run(f"{PY} -m train.gpucheck.stack", echo=True)  # fails when the pins no longer match it


# Where the README's settings table sits: between these markers, generated, never edited by hand.
TABLE_START, TABLE_END = "<!-- settings-table:start", "<!-- settings-table:end -->"


@task
def settings_files(c):
    """Write .env.example and README's settings table anew.

    From `python -m train settings --format env-example` and `--format table`: after a setting, a model
    or an extra is added or deleted, the two files list exactly the settings the package has."""
    made = {}
    for form in ("env-example", "table"):
        done = c.run(f"{PY} -m train settings --format {form}", hide=True, warn=True)
        if not done.ok:  # the package does not load (a fork's new setting refused, a typo): its last line
            why = (done.stderr.strip().splitlines() or [f"exit {done.exited}"])[-1]
            raise Exit(f"python -m train settings: {why}; nothing was written")
        made[form] = done.stdout
    env_example, table = made["env-example"], made["table"].strip("\n")
    readme = ROOT / "README.md"
    if not readme.is_file():
        raise Exit(f"{readme} is missing: run this in a checkout of the template (the image has no README)")
    text = readme.read_text()
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise Exit(
            f"{readme}: no settings table between `{TABLE_START} ...-->` and `{TABLE_END}`: put the two markers back"
        )
    body = text.index("-->", start) + len("-->")
    _write_all({readme: f"{text[:body]}\n\n{table}\n\n{text[end:]}", ROOT / ".env.example": env_example})
    print(f"wrote {ROOT / '.env.example'} and the settings table of {readme}")


def _write_all(files: dict[Path, str]) -> None:
    """Open every file before writing any (in order: the existing ones first), so that one that cannot be
    written leaves all of them as they were instead of half the pair new."""
    with contextlib.ExitStack() as stack:
        try:  # "a": creates a missing file and truncates nothing yet
            handles = {path: stack.enter_context(path.open("a")) for path in files}
        except OSError as error:
            raise Exit(f"{error.filename}: {error.strerror}; make it writable (nothing was written)") from None
        for path, handle in handles.items():
            handle.truncate(0)  # in "a" mode every write goes to the end: after this, to the start
            handle.write(files[path])


@task(
    help={
        "images": "also remove the images: compose's (down --rmi all) and every tag of IMAGE (build's, serve's)",
        "cpu": "the images were built with --cpu",
    }
)
def clean(c, images=False, cpu=False):
    """Remove caches and stopped containers; never runs/ or data/.

    Caches and build leftovers, and the stopped containers (and with --images every tag of IMAGE)."""
    c.run(
        "rm -rf .pytest_cache build dist *.egg-info && "
        "find . -path ./.venv -prune -o -name __pycache__ -prune -exec rm -rf {} +",
        echo=True,
    )
    if shutil.which("docker") is not None:
        try:
            compose = _compose(c, cpu, gpu_needed=False, local=False)
        except Exit as refusal:  # the caches are gone already: say so, and what was left
            raise Exit(f"caches removed; the containers were not: {refusal.message}") from None
        # A plain `down` leaves the containers of the services in a profile (tensorboard, serve, sweep,
        # mlflow, postgres) unless it is active (https://github.com/docker/compose/issues/11884): '*' is every one.
        c.run(f"{compose} --profile '*' down --remove-orphans", echo=True)
        if images:  # the image compose builds for train (tensorboard and sweep use it); not the pulled ones
            c.run(f"{compose} down --rmi all", echo=True)
            # `build`'s <target>-<lock>-<commit> tags (which `reproduce` reuses) and the serve image are no
            # service's image to compose: every tag of IMAGE goes, so that --images gives the space back.
            image = _compose_setting("IMAGE") or IMAGE
            listing = (
                f"docker image ls --filter reference={shlex.quote(image)} --format '{{{{.Repository}}}}:{{{{.Tag}}}}'"
            )
            tags = c.run(listing, hide=True, warn=True).stdout.split()
            if tags:  # an image a running container uses stays: docker says which, the rest go
                c.run("docker rmi " + " ".join(shlex.quote(t) for t in sorted(set(tags))), echo=True, warn=True)


@task(
    help={
        "run": "run id, run directory or 'latest'",
        "local": "rerun in this environment instead of the run's image",
        "allow_dirty": "rerun a run made from uncommitted changes (with the committed code)",
        "epochs": "stop after N epochs and compare with the original at that epoch (0 = the whole run)",
        "data_dir": "the host folder mounted as /data in the image (default ./data)",
        "base_image": "BASE_IMAGE build argument, if the run's image has to be built",
        "ca_bundle": "CA bundle (PEM) for pip behind a TLS-intercepting proxy, if the image has to be built",
    }
)
def reproduce(c, run, local=False, allow_dirty=False, epochs=0, data_dir="data", base_image="", ca_bundle=""):
    """Rerun a run from its record and say whether it matches.

    In its image (reused, or built from its commit), or --local in this environment."""
    flags = (" --allow-dirty" if allow_dirty else "") + (f" --epochs {int(epochs)}" if epochs else "")
    if local:
        c.run(f"{PY} -m train reproduce {shlex.quote(run)} --local{flags}", echo=True, pty=True)
        return
    _require_docker(c)
    flags += f" --data-dir {shlex.quote(data_dir)}"
    flags += f" --base-image {shlex.quote(base_image)}" if base_image else ""
    flags += f" --ca-bundle {shlex.quote(ca_bundle)}" if ca_bundle else ""
    c.run(f"{PY} -m train reproduce {shlex.quote(run)} --container{flags}", echo=True, pty=True)


@task(
    help={
        "space": "the space file (in the container: a file in ./sweeps, mounted as /sweeps)",
        "trials": "the study's total number of trials (0: the file's)",
        "storage": "--local: the study's database URL (default SWEEP_STORAGE, else SQLite in runs/sweeps)",
        "local": "run the sweep in this environment instead of the compose `sweep` profile",
        "workers": "in the container: this many sweep workers on the profile's PostgreSQL study",
        "cpu": "in the container: the CPU variant (no GPU needed)",
        "args": 'fixed settings for every trial, e.g. "--epochs 5"',
    }
)
def sweep(c, space, trials=0, storage="", local=False, workers=1, cpu=False, args=""):
    """Search hyperparameters: every trial an ordinary run.

    --local runs `python -m train sweep` here; otherwise N workers of the compose `sweep` profile
    share one study in its PostgreSQL service (docs/sweeps.md)."""
    args = _words("--args", args)
    _at_least_one("--workers", workers)
    flags = (f" --trials {int(trials)}" if trials else "") + (f" {args}" if args else "")
    if local and workers > 1:  # one process here: the count would be dropped without a word
        raise Exit(
            f"--workers {workers} is for the compose profile: with --local, run `invoke sweep {space} --local` "
            "in that many terminals on one study (the same --storage; docs/sweeps.md)"
        )
    if local:
        flags += f" --storage {shlex.quote(storage)}" if storage else ""
        c.run(f"{PY} -m train sweep {shlex.quote(space)}{flags}", echo=True, pty=True)
        return
    path = Path(space)
    if not path.is_file():
        raise Exit(f"{space}: no such file; write one like sweeps/example.toml (docs/sweeps.md)")
    if path.parent.resolve() != (ROOT / "sweeps").resolve():
        raise Exit(f"{space}: in the container a space file must be in ./sweeps (mounted as /sweeps): copy it there")
    if storage:
        raise Exit("--storage is for --local: the compose profile keeps the study in its PostgreSQL service")
    _volumes()
    extra = f"SWEEP_SPACE={shlex.quote(path.name)} " + (f"TRAIN_ARGS={shlex.quote(flags.strip())} " if flags else "")
    c.run(f"{extra}{_compose(c, cpu)} --profile sweep up --detach --scale sweep={int(workers)} sweep", echo=True)
    print("sweep workers in the background; follow them with: docker compose logs -f sweep")


ns = Collection(
    build,
    gpu_check,
    train,
    export,
    report,
    compare,
    logs,
    tensorboard,
    test,
    bench,
    mutate,
    lock,
    settings_files,
    clean,
    reproduce,
    serve,
    sweep,
)
