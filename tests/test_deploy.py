"""Launchers for several workers: the multi-worker compose file and the Kubernetes manifests say what matters.

Parsed, not run (running them needs Docker or a cluster): image, command, cluster settings,
volumes (only the chief gets RUNS_DIR where it can), the grace period for the SIGTERM save.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yamlish

from train.errors import Interrupted

ROOT = Path(__file__).resolve().parent.parent
if not (ROOT / "deploy").is_dir():
    pytest.skip("deploy/ and the compose files are host-side (not in the image)", allow_module_level=True)
IMAGE = "registry.example.com/tf-train-template:gpu"
# The launchers of several machines are the workers extra's (a fork without it deletes them), the
# serving Deployment the serve extra's.
WORKERS, SERVE = pytest.mark.extra("workers"), pytest.mark.extra("serve")


def _env(container) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _mounts(container) -> dict:
    return {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}


def test_yamlish_reads_what_it_claims_and_refuses_the_rest():
    doc = yamlish.load(
        'a: &x\n  b: 1\n  c: "two"  # note\nd:\n  <<: *x\n  c: three\ne:\n  - f: [g, "h"]\n    i: {j: true}\n  - k\n'
    )
    assert doc == {
        "a": {"b": 1, "c": "two"},
        "d": {"b": 1, "c": "three"},
        "e": [{"f": ["g", "h"], "i": {"j": True}}, "k"],
    }
    with pytest.raises(ValueError):
        yamlish.load("a: |\n  text\n")


@WORKERS
def test_compose_runs_two_workers_of_one_cluster_and_only_the_chief_mounts_runs():
    from train.workers.cluster import from_workers  # the workers extra's

    doc = yamlish.load((ROOT / "docker-compose.multiworker.yml").read_text())
    services = doc["services"]
    assert sorted(services) == ["worker0", "worker1"]
    clusters = []
    for i, name in enumerate(sorted(services)):
        svc = services[name]
        assert svc["command"] == "fit ${TRAIN_ARGS:-}" and svc["init"] is True and svc["stop_grace_period"] == "2m"
        assert svc["image"].endswith(":cpu") and svc["build"]["target"] == "runtime"
        assert svc["build"]["args"]["VARIANT"] == "cpu"
        env = svc["environment"]
        assert int(env["WORKER_INDEX"]) == i
        clusters.append(from_workers(env["WORKERS"], int(env["WORKER_INDEX"])))
        targets = [v["target"] for v in svc["volumes"]]
        assert ("/runs" in targets) == (i == 0), (name, targets)
        assert "/data" in targets
    assert clusters[0].workers == clusters[1].workers == ("worker0:2222", "worker1:2222")
    assert clusters[0].is_chief and not clusters[1].is_chief


@WORKERS
def test_tfjob_chief_alone_mounts_runs_and_every_pod_resumes_and_has_time_to_save():
    job, _policy = yamlish.load_all((ROOT / "deploy" / "k8s" / "tfjob.yaml").read_text())
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "TFJob"
    specs = job["spec"]["tfReplicaSpecs"]
    assert set(specs) == {"Chief", "Worker"} and specs["Chief"]["replicas"] == 1
    for role, spec in specs.items():
        assert spec["restartPolicy"] == "OnFailure"
        pod = spec["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] >= 60
        (c,) = pod["containers"]
        assert c["name"] == "tensorflow" and c["image"] == IMAGE and c["args"] == ["fit"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] >= 1
        assert {"name": "tfjob-port", "containerPort": 2222} in c["ports"]
        env = _env(c)
        assert (
            env["RESUME"] == "auto" and "WORKERS" not in env and "TF_CONFIG" not in env
        )  # the operator sets TF_CONFIG
        mounts = _mounts(c)
        assert "/data" in mounts and "/dev/shm" in mounts
        assert ("/runs" in mounts) == (role == "Chief") and (env.get("RUNS_DIR") == "/runs") == (role == "Chief")
        claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]}
        assert set(mounts.values()) <= set(claims)
    assert specs["Chief"]["template"]["spec"]["securityContext"]["fsGroup"] == 1000


@WORKERS
def test_indexed_job_builds_the_cluster_from_the_pod_index_behind_a_headless_service():
    from train.workers.cluster import from_workers  # the workers extra's

    service, job, _policy = yamlish.load_all((ROOT / "deploy" / "k8s" / "indexed-job.yaml").read_text())
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    spec = job["spec"]
    assert job["kind"] == "Job" and spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] and pod["restartPolicy"] == "OnFailure"
    assert pod["terminationGracePeriodSeconds"] >= 60
    (c,) = pod["containers"]
    assert c["image"] == IMAGE and c["args"] == ["fit"]
    env = _env(c)
    cluster = from_workers(env["WORKERS"], 0)
    assert len(cluster.workers) == spec["completions"]
    name, sub = job["metadata"]["name"], service["metadata"]["name"]
    assert cluster.workers == tuple(f"{name}-{i}.{sub}:2222" for i in range(spec["completions"]))
    index = env["WORKER_INDEX"]["fieldRef"]["fieldPath"]
    assert index == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["RESUME"] == "auto" and env["RUNS_DIR"] == "/runs"
    assert {"/runs", "/data", "/dev/shm"} <= set(_mounts(c))
    assert service["spec"]["ports"][0]["port"] == 2222 == c["ports"][0]["containerPort"]


def _trainjob():
    runtime, trainjob, policy = yamlish.load_all((ROOT / "deploy" / "k8s" / "trainjob.yaml").read_text())
    return runtime, trainjob, policy


@WORKERS
def test_trainjob_uses_its_own_plain_runtime_not_a_framework_one():
    runtime, trainjob, _policy = _trainjob()
    assert runtime["apiVersion"] == trainjob["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert runtime["kind"] == "TrainingRuntime" and trainjob["kind"] == "TrainJob"
    ref = trainjob["spec"]["runtimeRef"]
    assert ref == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": runtime["metadata"]["name"]}
    # No torch/mpi/jax/... source: the plain policy, which sets no cluster variables of its own.
    assert set(runtime["spec"]["mlPolicy"]) == {"numNodes"}
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node" and job["replicas"] == 1
    assert job["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert job["template"]["spec"]["completionMode"] == "Indexed"
    pod = job["template"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["name"] == "node" and c["image"] == IMAGE  # the container the trainer fills in
    assert pod["restartPolicy"] == "OnFailure" and pod["terminationGracePeriodSeconds"] >= 60
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["fsGroup"] == 1000
    assert {"/runs", "/data", "/dev/shm"} <= set(_mounts(c))


@WORKERS
def test_trainjob_builds_the_cluster_from_the_jobset_pod_names_and_the_completion_index():
    from train.workers.cluster import from_workers  # the workers extra's

    _runtime, trainjob, _policy = _trainjob()
    trainer, name = trainjob["spec"]["trainer"], trainjob["metadata"]["name"]
    assert trainer["image"] == IMAGE and trainer["args"] == ["fit"]
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] >= 1
    env = _env(trainer)
    assert "TF_CONFIG" not in env and env["RESUME"] == "auto" and env["RUNS_DIR"] == "/runs"
    cluster = from_workers(env["WORKERS"], 0)
    # JobSet's pod hostname <jobset>-<replicated job>-<job index>-<pod index>, under the headless
    # Service named after the JobSet, which is the TrainJob's name.
    assert cluster.workers == tuple(f"{name}-node-0-{i}.{name}:2222" for i in range(trainer["numNodes"]))
    index = env["WORKER_INDEX"]["fieldRef"]["fieldPath"]
    assert index == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert int(env["BATCH_SIZE"]) % trainer["numNodes"] == 0


@WORKERS
def test_trainjob_pods_accept_the_training_port_only_from_each_other():
    runtime, trainjob, policy = _trainjob()
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    # JobSet labels every pod with the JobSet's name, which is the TrainJob's.
    labels = {"jobset.sigs.k8s.io/jobset-name": trainjob["metadata"]["name"]}
    _only_from_themselves(policy, labels, _training_ports(job["template"]["spec"]["template"]["spec"]))
    assert _training_ports(job["template"]["spec"]["template"]["spec"]) == {2222}


# TensorFlow's training server listens on every interface, unauthenticated, whatever address the
# cluster names: every launcher keeps the port unreachable from outside the training cluster.
@WORKERS
def test_compose_workers_publish_no_port_and_share_an_internal_network_only():
    doc = yamlish.load((ROOT / "docker-compose.multiworker.yml").read_text())
    assert doc["networks"] == {"default": {"internal": True}}
    for name, svc in doc["services"].items():
        assert "ports" not in svc and "expose" not in svc, name
        assert "network_mode" not in svc and set(svc.get("networks", ["default"])) == {"default"}, name


def _training_ports(pod_spec) -> set[int]:
    return {p["containerPort"] for c in pod_spec["containers"] for p in c.get("ports", [])}


def _only_from_themselves(policy, labels: dict, ports: set[int]) -> None:
    spec = policy["spec"]
    assert policy["kind"] == "NetworkPolicy" and policy["apiVersion"] == "networking.k8s.io/v1"
    assert spec["podSelector"] == {"matchLabels": labels} and "Ingress" in spec["policyTypes"]
    assert spec["ingress"], "an empty ingress list would let nothing in, not even the other workers"
    for rule in spec["ingress"]:
        assert rule["from"] == [{"podSelector": {"matchLabels": labels}}], rule  # no ipBlock, no namespace
        assert {p["port"] for p in rule["ports"]} <= ports and all(p["protocol"] == "TCP" for p in rule["ports"])


@WORKERS
def test_tfjob_pods_accept_the_training_port_only_from_each_other():
    job, policy = yamlish.load_all((ROOT / "deploy" / "k8s" / "tfjob.yaml").read_text())
    ports = set().union(*(_training_ports(s["template"]["spec"]) for s in job["spec"]["tfReplicaSpecs"].values()))
    # The training operator labels every pod of the TFJob with its name.
    _only_from_themselves(policy, {"training.kubeflow.org/job-name": job["metadata"]["name"]}, ports)


@WORKERS
def test_indexed_job_pods_accept_the_training_port_only_from_each_other():
    service, job, policy = yamlish.load_all((ROOT / "deploy" / "k8s" / "indexed-job.yaml").read_text())
    labels = {"job-name": job["metadata"]["name"]}  # the Job controller's label, as the Service selects
    assert service["spec"]["selector"] == labels
    _only_from_themselves(policy, labels, _training_ports(job["spec"]["template"]["spec"]))


def test_every_kubernetes_manifest_has_its_network_policy():
    for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        kinds = [d["kind"] for d in yamlish.load_all(path.read_text())]
        assert "NetworkPolicy" in kinds, path.name


def test_every_file_with_the_placeholder_image_says_to_replace_it():
    """Applied as it is, a manifest pulls registry.example.com's image and waits in ImagePullBackOff."""
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        text = path.read_text()
        if IMAGE in text:
            assert "Replace the image with the one you pushed" in text, path.name


@WORKERS
def test_documented_exit_codes_match_the_package():
    from train.errors import WorkerLostError

    for name in ("tfjob.yaml", "indexed-job.yaml", "trainjob.yaml"):
        text = (ROOT / "deploy" / "k8s" / name).read_text()
        assert f"exit {WorkerLostError.exit_code}" in text and f"exits {Interrupted.exit_code}" in text, name


@SERVE
def test_serve_deployment_probes_the_v2_health_endpoints_the_server_has():
    from dataclasses import fields

    from train.cli import build_parser
    from train.config import Settings
    from train.serve import server
    from train.serve.app import State, build_app

    deployment, service, policy = yamlish.load_all((ROOT / "deploy" / "k8s" / "serve.yaml").read_text())
    assert [d["kind"] for d in (deployment, service, policy)] == ["Deployment", "Service", "NetworkPolicy"]
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"] == service["spec"]["selector"]
    (c,) = pod["spec"]["containers"]
    drain = float(_env(c).get("SERVE_DRAIN_SECONDS", Settings().serve_drain_seconds))
    # The drain and the exit after it (within uvicorn's backstop) fit before SIGKILL.
    assert pod["spec"]["terminationGracePeriodSeconds"] > drain + server.BACKSTOP
    assert c["image"].endswith(":serve")
    args = build_parser().parse_args(c["args"])
    assert args.command == "serve" and args.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == args.port and service["spec"]["ports"][0]["targetPort"] == "http"
    paths = {r.path for r in build_app(State(None, 1, 0, 1, 1)).routes}
    for probe, path in (("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live")):
        assert c[probe]["httpGet"] == {"path": path, "port": "http"} and path in paths
    assert set(_env(c)) <= {f.name.upper() for f in fields(Settings)}
    assert all(m["readOnly"] for m in c["volumeMounts"] if m["mountPath"] == "/runs")
    assert policy["spec"]["podSelector"]["matchLabels"] == pod["metadata"]["labels"]
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": args.port}]


def test_compose_serve_profile_publishes_on_loopback_only_and_reads_runs_read_only():
    svc = yamlish.load((ROOT / "docker-compose.yml").read_text())["services"]["serve"]
    assert svc["profiles"] == ["serve"] and svc["build"]["target"] == "serve"
    assert svc["ports"] and all(p.startswith("127.0.0.1:") for p in svc["ports"])
    assert svc["init"] is True and "--host 0.0.0.0" in svc["command"]
    (runs,) = svc["volumes"]
    assert runs["target"] == "/runs" and runs["read_only"] is True
    # (the CPU file uses compose's `!reset`, which yamlish does not read)
    assert "  serve:\n    build:\n      args:\n        VARIANT: cpu" in (ROOT / "docker-compose.cpu.yml").read_text()


def test_sweep_job_runs_indexed_sweep_workers_on_one_study_with_the_url_from_a_secret():
    job, policy = yamlish.load_all((ROOT / "deploy" / "k8s" / "sweep-job.yaml").read_text())
    spec = job["spec"]
    assert (
        job["kind"] == "Job" and spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] > 1
    )
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "OnFailure" and pod["terminationGracePeriodSeconds"] >= 60  # 75 restarts in place
    (c,) = pod["containers"]
    assert c["image"] == IMAGE and c["args"][0] == "sweep"
    space = Path(c["args"][1])
    mounts = _mounts(c)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[str(space.parent)]]["configMap"]["name"] == "tf-sweep-space"
    env = _env(c)
    assert env["SWEEP_STORAGE"] == {"secretKeyRef": {"name": "tf-sweep-db", "key": "url"}}  # no password in the file
    assert env["RUNS_DIR"] == "/runs" and "/runs" in mounts and "/data" in mounts
    assert "WORKERS" not in env and "ports" not in c  # independent processes sharing a study, not one cluster
    assert policy["kind"] == "NetworkPolicy" and policy["spec"]["podSelector"] == {
        "matchLabels": {"job-name": "tf-sweep"}
    }
    assert policy["spec"]["ingress"] == []  # the workers serve nothing


def test_compose_sweep_profile_scales_workers_on_one_postgres_study():
    doc = yamlish.load((ROOT / "docker-compose.yml").read_text())
    sweep, db = doc["services"]["sweep"], doc["services"]["postgres"]
    assert sweep["profiles"] == ["sweep"] == db["profiles"]
    assert (
        sweep["command"].startswith("sweep /sweeps/") and "container_name" not in sweep
    )  # --scale needs no fixed name
    assert (
        sweep["depends_on"] == {"postgres": {"condition": "service_healthy"}}
        and "pg_isready" in db["healthcheck"]["test"]
    )
    env = sweep["environment"]
    assert (
        env["RUNS_DIR"] == "/runs"
        and env["SWEEP_STORAGE"].startswith("postgresql://sweep:")
        and "@postgres:5432/" in env["SWEEP_STORAGE"]
    )
    assert "ports" not in db  # the database is reachable from the sweep workers only
    assert sweep["init"] is True and sweep["stop_grace_period"] == "2m"
    cpu = (ROOT / "docker-compose.cpu.yml").read_text()  # `!reset` is beyond yamlish: the lines themselves
    assert "  sweep:\n    image: ${IMAGE:-tf-train-template}:cpu\n    deploy: !reset {}\n" in cpu
