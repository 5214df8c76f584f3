"""Where a partition resumes: the stage's own lookup of the committed offset answers
before librdkafka's (held by the fault proxy), so the seek is refused with _STATE
(not fetching yet). The partition must stay paused and be sought again until the
seek lands, then process exactly once from the committed offset.

The old stage took the refusal to mean "librdkafka starts from the committed offset
itself" and resumed at once, leaving librdkafka's application position as it was
(see docs/state-machine.md, "A seek is checked, not trusted"; the scripted cases are
in tests/unit/test_positioning.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.harness.kafka import KafkaService, ProxiedKafka
from tests.harness.proxy import Api
from tests.integration.conftest import PARTITIONS, StageSetup
from tests.integration.replicas import produce_inputs, wait_for

pytestmark = pytest.mark.kafka


def test_a_seek_refused_before_the_fetcher_starts_lands_later(
        proxied_kafka: ProxiedKafka, stage_on: Callable[[KafkaService], StageSetup]) -> None:
    stage = stage_on(proxied_kafka)  # type: ignore[arg-type]
    produce_inputs(proxied_kafka.direct_bootstrap, stage.input_topic, range(400), PARTITIONS)
    held = proxied_kafka.proxy.delay_request(Api.OFFSET_FETCH, 3.0,
                                             client_id="txstage-*-consumer-*", duration_s=20)
    replica = stage.replica("a")
    wait_for(lambda: bool(replica.events("partition.seek_deferred")), 30,
             "a seek refused while librdkafka's committed-offset query is held", stage.logs)
    proxied_kafka.proxy.clear(held)
    produce_inputs(proxied_kafka.direct_bootstrap, stage.input_topic, range(400, 800),
                   PARTITIONS)
    stage.wait_committed(60)
    stage.assert_exactly_once()
    assert replica.terminate() == 0
