"""The librdkafka boundary: the only package that catches KafkaException.

    errors.py       KafkaException -> the txstage error that says what to do
    config.py       Settings -> librdkafka configuration dicts
    retry.py        retry_until: the one blocking retry loop (RetriableError until a deadline)
    producer.py     PinnedProducer: the only class that drives a transactional producer
    spanning_producer.py  SpanningProducer: one PinnedProducer for all of a replica's partitions
    transaction.py  the commit: send_offsets_to_transaction + commit_transaction
    delivery.py     failed deliveries, recorded by callbacks that never raise
    messages.py     a consumed Message -> Record
    cluster.py      facts about the cluster: topics, their limits, committed offsets
    reading.py      reading back: committed offsets, end offsets, records
"""
