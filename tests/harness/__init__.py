"""Test harness: helpers around a real Apache Kafka broker.

The broker itself (install, ``KafkaCluster`` with 1 or 3 KRaft nodes and
stop/kill/pause/resume/restart, ``txstage kafka install|up|down|status``) is a product
feature: :mod:`service.local_kafka`.

- ``tests.harness.kafka``: ``KafkaService`` / ``RunningKafka`` (what the ``kafka`` fixture
  hands out) and the runner's names re-exported for tests.
- ``tests.harness.reading``: ``read_committed``, ``read_uncommitted``, ``end_offsets``,
  ``committed_offsets`` and the ``ReadRecord`` they return.
- ``tests.harness.admin``: ``create_topic``, leaders, ISRs, live brokers.
"""
