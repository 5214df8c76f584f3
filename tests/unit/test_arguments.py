"""Option values that start with '-' (service/arguments.py), in every command's parser."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from service import cli
from service.arguments import Parser, joined_values
from service.tools import topics
from service.tools.redrive import cli as redrive_cli


def test_a_dash_value_is_joined_to_its_option_unless_it_is_an_option() -> None:
    p = Parser()
    p.add_argument("--name")
    p.add_argument("--flag", action="store_true")
    p.add_argument("rest", nargs="*")
    assert joined_values(p, ["--name", "-x", "--flag", "--", "--name", "-y"]) == \
        ["--name=-x", "--flag", "--", "--name", "-y"]
    assert joined_values(p, ["--name", "--flag"]) == ["--name", "--flag"]
    assert vars(p.parse_args(["--name", "-x"])) == {"name": "-x", "flag": False, "rest": []}
    with pytest.raises(SystemExit):
        p.parse_args(["--name", "--flag"])  # --name lacks its value, as argparse says


@pytest.mark.parametrize("parse", [cli.parser().parse_args,
                                   lambda argv: topics.parser().parse_args(argv[1:])])
def test_the_tools_take_topics_that_start_with_a_dash(
        parse: Callable[[list[str]], argparse.Namespace]) -> None:
    assert parse(["topics", "create", "--topic", "-x"]).topic == ["-x"]


def test_redrive_takes_a_parking_topic_that_starts_with_a_dash() -> None:
    assert redrive_cli.parser().parse_args(["--parking-topic", "-parked"]).parking_topic == \
        "-parked"
