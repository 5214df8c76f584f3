"""A real Apache Kafka broker (KRaft) on this machine: for development, the demo, the
benchmarks and the test suite. No Docker, no tarball: the broker's jars are resolved from
Maven Central into ``$TXSTAGE_CACHE_DIR`` (default ``~/.cache/txstage``) and each node
runs as a plain JVM process, a combined broker+controller. Needs Java 17+ and Maven.

Modules, each named for its job:

    errors.py       ``LocalKafkaError``, ``KafkaStartError``
    jars.py         resolve and cache the jars once (``pom.xml``, ``log4j2.properties``
                    ship here as package data); ``KAFKA_VERSION``, ``install()``
    properties.py   ``server.properties`` of a node (``broker_properties``), Kafka uuids
    security.py     a secured node: CA and broker certificate (keytool), SASL_SSL with
                    SCRAM-SHA-512, the StandardAuthorizer; SCRAM users via the admin API
    node.py         one JVM: format, start, signal, stop, kill; its log; free ports
    readiness.py    ``wait_ready``: listed brokers, transactions and groups served
    cluster.py      ``KafkaCluster``: 1 or 3 nodes on free ports in a temp dir, with faults
                    (stop, kill, pause, resume, restart, heal), gone when closed
    cli.py          ``txstage kafka install|up|down|status`` (also
                    ``python -m service.local_kafka``): one detached node on 127.0.0.1:9092

Nothing is imported here: ``txstage run`` never loads any of it, and each module imports
only the ones listed above it.
"""
