"""What goes wrong with the local broker."""

from __future__ import annotations


class LocalKafkaError(RuntimeError):
    """The local broker could not be installed, started or stopped."""


class KafkaStartError(LocalKafkaError):
    """A node did not become ready; the message ends with the broker's log tail."""
