"""Test harness: everything a test uses that is not a test. The broker itself
(install, ``KafkaCluster`` with 1 or 3 KRaft nodes and its faults) is a product
feature: :mod:`service.local_kafka`.

- ``kafka``: ``KafkaService`` / ``RunningKafka`` (what the ``kafka`` fixture hands out)
- ``replica``: ``Replica``, one stage as a real process (on :mod:`bench.replica`)
- ``stage``: ``StageSetup`` and ``build_stage`` (topics, group and replicas of one
  stage), waiting and input helpers
- ``transforms``: the transforms tests name in ``TXSTAGE_TRANSFORM``
- ``reading``: ``read_committed``, ``read_uncommitted``, ``end_offsets``, ``committed_offsets``
- ``admin``: ``create_topic``, leaders, ISRs, live brokers
- ``proxy``: a Kafka-protocol fault proxy; ``containers``: podman images
- ``operator_tools``, ``backfill_faults``, ``offset_hammer``, ``spark``: helpers of
  the tool, backfill and offset-reading tests
- ``durations``: seconds per test module, printed at the end of a run
"""
