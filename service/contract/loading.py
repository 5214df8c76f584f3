"""Loading the user's transform from a ``module.path:function`` reference."""

from __future__ import annotations

import importlib
from typing import cast

from service.contract.records import Transform
from service.errors import ConfigError


def load_transform(ref: str) -> Transform:
    """Import ``module.path:function`` and return the callable.

    Raises ConfigError (exit code 2 at the CLI) naming what is wrong.
    """
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"TXSTAGE_TRANSFORM={ref!r} must have the form 'module.path:function'"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(
            f"TXSTAGE_TRANSFORM={ref!r}: cannot import module {module_name!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    target: object = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise ConfigError(
                f"TXSTAGE_TRANSFORM={ref!r}: module {module_name!r} has no attribute {attr!r}"
            ) from exc
    if not callable(target):
        raise ConfigError(
            f"TXSTAGE_TRANSFORM={ref!r}: {attr!r} is a {type(target).__name__}, not callable"
        )
    return cast(Transform, target)
