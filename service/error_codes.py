"""The Kafka protocol's and librdkafka's error codes that txstage's pure parts read,
as numbers, so the state machine and the exception tree need no confluent_kafka.
``tests/unit/test_error_codes.py`` holds each equal to ``confluent_kafka.KafkaError``'s.
"""

from __future__ import annotations

UNKNOWN_TOPIC_OR_PART = 3
MSG_SIZE_TOO_LARGE = 10
RECORD_LIST_TOO_LARGE = 18
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_TIMESTAMP = 32
POLICY_VIOLATION = 44
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
SASL_AUTHENTICATION_FAILED = 58
INVALID_RECORD = 87
LOCAL_AUTHENTICATION = -169   # librdkafka's _AUTHENTICATION
LOCAL_TIMED_OUT = -185        # _TIMED_OUT
LOCAL_UNKNOWN_TOPIC = -188    # _UNKNOWN_TOPIC
LOCAL_MSG_TIMED_OUT = -192    # _MSG_TIMED_OUT

# Answers that refuse a record itself: sending it again cannot help.
# _INVALID_DIFFERENT_RECORD marks the innocent neighbours of a refused record in
# the same batch (librdkafka reads the broker's per-record errors), so it is not one.
# An output topic deleted while the stage runs is refused too (the producer's
# _UNKNOWN_TOPIC at produce(), UNKNOWN_TOPIC_OR_PART in a delivery report once its
# retries ran out): the record is sent once more, then dead-lettered.
UNKNOWN_TOPICS = frozenset({LOCAL_UNKNOWN_TOPIC, UNKNOWN_TOPIC_OR_PART})
REFUSALS = frozenset({
    INVALID_RECORD, MSG_SIZE_TOO_LARGE, RECORD_LIST_TOO_LARGE, INVALID_TIMESTAMP,
    POLICY_VIOLATION, *UNKNOWN_TOPICS,
})
# Answers after which the stage looks its output topics up again. A topic deleted
# just before a producer first asks for it is not refused at once: librdkafka waits
# topic.metadata.propagation.max.ms (30 s) before it believes the topic is gone,
# and a transaction time-out below that times the outputs out instead, every replay.
LOOK_AGAIN = UNKNOWN_TOPICS | {LOCAL_MSG_TIMED_OUT, LOCAL_TIMED_OUT}
# The broker refused the principal: no retry or abort can change that.
AUTHENTICATION = frozenset({SASL_AUTHENTICATION_FAILED, LOCAL_AUTHENTICATION})
DENIALS = frozenset({
    TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED, *AUTHENTICATION,
})
