"""Test harness: a real Apache Kafka broker and helpers around it.

- ``tests.harness.kafka``: install the broker (Maven), ``KafkaCluster`` (1 or 3 KRaft nodes
  with stop/kill/pause/resume/restart), the ``install|up|down|status`` CLI.
- ``tests.harness.reading``: ``read_committed``, ``read_uncommitted``, ``end_offsets``,
  ``committed_offsets`` and the ``ReadRecord`` they return.
- ``tests.harness.admin``: ``create_topic``, leaders, ISRs, live brokers.

Nothing is imported here, so ``python -m tests.harness.kafka`` runs the module only once.
"""
