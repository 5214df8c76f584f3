"""The argparse parser of every ``txstage`` command: an option's value may start with '-'.

argparse takes every argument that starts with '-' (a negative number aside) for an
option, so ``--topic-suffix -v2`` failed with "expected one argument", although topic
names, suffixes, job ids and prefixes may all start with '-'. This parser passes such
a value to the option before it (as ``--topic-suffix=-v2``, which argparse reads
unambiguously) unless it is itself one of the parser's options, spelled in full:
``--job-id --dry-run`` still says that ``--job-id`` lacks its value.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from typing import Any


class Parser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose single-value options take values that start
    with '-' (``--topic-suffix -v2``)."""

    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: Any = None) -> tuple[Any, list[str]]:
        argv = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(joined_values(self, argv), namespace)


def joined_values(parser: argparse.ArgumentParser, args: Sequence[str]) -> list[str]:
    """``args`` with each ``--option -value`` of a single-value option as
    ``--option=-value``; nothing after ``--`` changes."""
    # _option_string_actions holds every option of the parser, those of its argument
    # groups included: argparse has no public way to list them.
    options: dict[str, argparse.Action] = parser._option_string_actions
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return [*out, *args[i:]]
        action = options.get(arg)
        if action is not None and action.nargs is None and i + 1 < len(args):
            value = args[i + 1]
            if value.startswith("-") and value != "--" and value not in options:
                out.append(f"{arg}={value}")
                i += 2
                continue
        out.append(arg)
        i += 1
    return out
