"""TensorFlow's join: MultiWorkerMirroredStrategy for a cluster, with bounded failure detection."""

from __future__ import annotations

import logging

import tensorflow as tf

from . import PortInUseError

log = logging.getLogger("train")


# A dead worker (SIGKILL, lost host) is noticed by the coordination service's heartbeat; a live one
# that stops answering by the collective timeout. Both are errors on the survivors, never a hang.
HEARTBEAT_SECONDS = 30
COLLECTIVE_TIMEOUT_SECONDS = 600  # generous: a chief writing a large checkpoint keeps the others waiting


def join_cluster(cluster):
    """MultiWorkerMirroredStrategy for `cluster`, with bounded failure detection."""
    import os

    from tensorflow.python.eager import context  # no public API sets the heartbeat timeout

    # TensorFlow's cluster resolver reads TF_CONFIG; WORKERS or SkyPilot's variables are turned into one.
    os.environ["TF_CONFIG"] = cluster.tf_config_for(os.environ)
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2

    jobs = [coordination_config_pb2.CoordinatedJob(name="worker", num_tasks=len(cluster.workers))]
    if cluster.source == "TF_CONFIG":
        import json

        spec = json.loads(os.environ["TF_CONFIG"])["cluster"]
        jobs = [
            coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(spec[job]))
            for job in ("chief", "worker")
            if spec.get(job)
        ]
    leader = "/job:chief/replica:0/task:0" if jobs[0].name == "chief" else "/job:worker/replica:0/task:0"
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=leader,
        coordinated_jobs=jobs,
        heartbeat_timeout_in_ms=HEARTBEAT_SECONDS * 1000,
    )
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=COLLECTIVE_TIMEOUT_SECONDS)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except tf.errors.UnknownError as exc:
        # train.workers.join held the port a moment ago; another process took it since.
        if "Could not start gRPC server" not in str(exc):
            raise
        raise PortInUseError(cluster.source, cluster.workers[cluster.index], cluster.port) from None
    log.info("%s: %d replica(s) in sync", cluster.describe(), strategy.num_replicas_in_sync)
    return strategy
