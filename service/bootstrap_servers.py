"""What is wrong with a ``bootstrap.servers`` list, said the way a user can fix it."""

from __future__ import annotations

import re

_BROKER = re.compile(r"(?:\w+://)?(?:\[[0-9A-Fa-f:.]+(?:%\w+)?\]|[\w.-]+):(?P<port>\d{1,5})",
                     re.ASCII)  # librdkafka allows <protocol>:// before each
_EXAMPLE = "e.g. kafka-1:9092,kafka-2:9092 or [::1]:9092"


def bootstrap_problem(value: str) -> str | None:
    """What is wrong with a bootstrap.servers list (comma-separated host:port, port
    1-65535, an IPv6 address in brackets), or None; the whole value is quoted."""
    entries = [entry.strip() for entry in value.split(",") if entry.strip()]
    if not entries:
        return f"empty: name the brokers as comma-separated host:port, {_EXAMPLE}"
    for entry in entries:
        found = _BROKER.fullmatch(entry)
        why = ("has a space" if any(char.isspace() for char in entry) else
               "has no port" if ":" not in entry else
               "has a ';': separate brokers with commas" if ";" in entry else
               "needs brackets around its IPv6 address" if "[" not in entry
               and entry.count(":") > 1 and "://" not in entry else
               "is not host:port" if found is None else
               f"has the port {found['port']}, not 1-65535"
               if not 1 <= int(found["port"]) <= 65535 else None)
        if why is not None:
            return f"{value!r} is not a comma-separated list of host:port, {_EXAMPLE} " \
                   f"({entry!r} {why})"
    return None
