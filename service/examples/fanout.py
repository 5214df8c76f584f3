"""A fan-out: several outputs per input, some to another topic.

Each line of the input value becomes one output on the default output topic;
a summary with the line count goes to the topic named by the environment
variable ``TXSTAGE_EXAMPLE_SUMMARY_TOPIC`` (default ``txstage-summary``).
"""

import os
from collections.abc import Iterator

from service.contract.records import Output, Record


def split_lines(record: Record) -> Iterator[Output]:
    lines = (record.value or b"").splitlines()
    for line in lines:
        yield Output(value=line, key=record.key)
    summary_topic = os.environ.get("TXSTAGE_EXAMPLE_SUMMARY_TOPIC", "txstage-summary")
    yield Output(value=str(len(lines)).encode(), key=record.key, topic=summary_topic)
