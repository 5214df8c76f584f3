"""The transform as every caller but the stage's start-up loads it (the tools, the
backfill's driver and tasks): ``TXSTAGE_TRANSFORM`` wrapped in the settings' formats.
Light to import: the formats' libraries load only when a format is set."""

from __future__ import annotations

import importlib
from types import ModuleType

from service.contract.loading import load_transform
from service.contract.records import Transform
from service.errors import ConfigError
from service.settings import Settings


def load_formatted(ref: str, settings: Settings | None, default_topic: str | None = None
                   ) -> Transform:
    """``ref`` loaded; decoding and encoding around it when ``settings`` set a format.
    An output for the default topic is encoded for ``default_topic``'s subject (the
    settings' output topic unless given: a backfill gives the stage's live topic, so it
    writes the bytes the stream writes, wherever it writes them)."""
    transform = load_transform(ref)
    if settings is None or not settings.formatted:
        return transform
    codec = codec_module()
    wrapped: Transform = codec.with_formats(transform, codec.build(settings, ref),
                                            default_topic or settings.output_topic)
    return wrapped


def codec_module() -> ModuleType:
    """``service.formats.codec``, or a ConfigError naming the extra its libraries come in."""
    try:
        return importlib.import_module("service.formats.codec")
    except ImportError as exc:
        raise ConfigError(f"a key or value format needs the schemas extra (pip install "
                          f"'txstage[schemas]'): {exc}") from exc
