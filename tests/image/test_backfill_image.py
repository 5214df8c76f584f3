"""The backfill image (``txstage-backfill:dev``) runs a Kafka → Kafka backfill of the
stage image's input with no network beyond the broker (nothing is fetched at run time:
the tasks read Kafka with librdkafka), and its outputs equal the stage container's
record for record."""

from __future__ import annotations

import uuid

import pytest

from service.backfill import parity
from tests.harness.admin import create_topic
from tests.harness.containers import Engine
from tests.image.conftest import RECORDS, StreamRun

pytestmark = pytest.mark.image

REACH_MAVEN = ("import socket\n"
               "try:\n"
               "    socket.create_connection(('repo.maven.apache.org', 443), timeout=5)\n"
               "except OSError as exc:\n"
               "    raise SystemExit(f'offline: {exc}')\n"
               "print('online')\n")


def test_the_backfill_image_runs_a_kafka_backfill_offline_equal_to_the_stream(
        engine: Engine, backfill_image: str, streamed: StreamRun) -> None:
    container = ("run", "--rm", "--network", "host", "--read-only", "--tmpfs", "/tmp")
    probe = engine(*container, "--entrypoint", "python", backfill_image, "-c", REACH_MAVEN,
                   check=False)
    assert probe.returncode != 0, ("the backfill container reached Maven Central: run this "
                                   "test offline (make image-test, deploy/images/offline.sh)")

    setup = streamed.setup
    suffix = uuid.uuid4().hex[:8]
    out = create_topic(setup.bootstrap, f"img-bf-out-{suffix}", partitions=4)
    dlq = create_topic(setup.bootstrap, f"img-bf-dlq-{suffix}", partitions=1)
    run = engine(*container, backfill_image, "backfill", "run",
                 "--source", f"kafka://{setup.input_topic}", "--sink", f"kafka://{out}",
                 "--dlq-topic", dlq, "--bootstrap-servers", setup.bootstrap,
                 "--transform", "service.examples.square:square", "--master", "local[2]",
                 check=False, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]

    stream = parity.from_topics(setup.bootstrap, [setup.output_topic, setup.dlq_topic])
    backfill = parity.from_topics(setup.bootstrap, [out, dlq])
    report = parity.compare(stream, backfill,
                            rename={setup.output_topic: out, setup.dlq_topic: dlq})
    assert report.ok, report.problems()
    assert report.expected == report.actual == RECORDS
