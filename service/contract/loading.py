"""Loading the user's transform from a ``module.path:function`` reference.

One rule for every way txstage starts (the ``txstage`` console script, ``python -m
service``, the container): the module is looked for in the current directory first,
then on PYTHONPATH and in the installed packages, as ``python -m`` looks."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
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
    _current_directory_first()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        hint = (f" (looked in {os.getcwd()}, PYTHONPATH and the installed packages)"
                if isinstance(exc, ModuleNotFoundError) else "")
        raise ConfigError(
            f"TXSTAGE_TRANSFORM={ref!r}: cannot import module {module_name!r}: "
            f"{type(exc).__name__}: {exc}{hint}"
        ) from exc
    target: object = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise ConfigError(
                f"TXSTAGE_TRANSFORM={ref!r}: module {module_name!r} has no attribute "
                f"{attr!r}{_did_you_mean(module_name, attr, target, part)}"
            ) from exc
    if not callable(target):
        raise ConfigError(
            f"TXSTAGE_TRANSFORM={ref!r}: {attr!r} is a {type(target).__name__}, not callable"
        )
    return cast(Transform, target)


def _did_you_mean(module_name: str, attr: str, owner: object, missing: str) -> str:
    """`` (did you mean module:name?)`` for the callable of ``owner`` spelt closest to
    ``missing`` (the part of ``attr`` not found), or the callables there are. Of a
    module, only those it defines: not what it imported (``Record``, ``Iterator``)."""
    callables = sorted(name for name in dir(owner) if not name.startswith("_")
                       and callable(value := getattr(owner, name, None))
                       and getattr(value, "__module__", module_name) == module_name)
    close = difflib.get_close_matches(missing, callables, 1, 0.6)
    if close:
        found = attr[:len(attr) - len(missing)] + close[0]  # the same path, its last part
        return f" (did you mean {module_name}:{found}?)"
    if callables and len(callables) <= 10:
        return f" (its callables: {', '.join(callables)})"
    return ""


def _current_directory_first() -> None:
    """What ``python -m`` does and a console script does not: the current directory
    at the front of ``sys.path``."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
