"""check-config's part for formats: the schemas the settings name can be read, the
registry answers, and every output subject has a schema the stage can write with: the
schema file registered under it (or auto-registration on) and compatible with the
subject's latest version under the subject's compatibility level. Side-effect free:
nothing is registered here."""

from __future__ import annotations

from confluent_kafka.schema_registry import Schema

from service.errors import ConfigError
from service.formats.codec import build
from service.formats.codecs import _TYPES, RegistryEncoder
from service.formats.errors import RegistryError
from service.formats.registry import not_found
from service.settings import Settings

_REACH_S = 10.0


def check_formats(settings: Settings) -> None:
    """Raise ConfigError, one line per problem, each naming the setting or subject."""
    codecs = build(settings, settings.transform)
    registry = codecs.registry
    if registry is None:
        return
    try:
        registry.blocking("listing subjects", registry.client.get_subjects, _REACH_S)
    except RegistryError as exc:
        raise ConfigError(f"TXSTAGE_REGISTRY_URL={settings.registry_url}: does not answer "
                          f"({exc.__cause__})") from exc
    problems = []
    for part, encoder in codecs.encoders.items():
        subject = encoder.subject(settings.output_topic)
        try:
            problem = _subject_problem(encoder, subject)
        except RegistryError as exc:
            problem = f"subject {subject!r}: {exc.__cause__}"
        if problem:
            problems.append(f"TXSTAGE_{part.upper()}_FORMAT: {problem}")
    if problems:
        raise ConfigError(*problems)


def _subject_problem(encoder: RegistryEncoder, subject: str) -> str | None:
    client, source = encoder.registry.client, encoder.source
    ask = encoder.registry.blocking
    if source.text is None:
        try:
            ask(f"subject {subject}", lambda: client.get_latest_version(subject), _REACH_S)
        except RegistryError as exc:
            if not_found(exc.__cause__):  # type: ignore[arg-type]
                return f"subject {subject!r} has no schema registered"
            raise
        return None
    schema = Schema(source.text, _TYPES[source.fmt])
    try:
        compatible = ask(f"subject {subject}",
                         lambda: client.test_compatibility(subject, schema), _REACH_S)
    except RegistryError as exc:
        if not not_found(exc.__cause__):  # type: ignore[arg-type]
            raise
        compatible = True  # a new subject: anything is compatible with nothing
    if not compatible:
        return (f"subject {subject!r}: the schema file is not compatible with the "
                "subject's latest version under its compatibility level")
    try:
        ask(f"subject {subject}", lambda: client.lookup_schema(subject, schema), _REACH_S)
    except RegistryError as exc:
        if not not_found(exc.__cause__) or source.auto_register:  # type: ignore[arg-type]
            return None if source.auto_register else str(exc)
        return (f"subject {subject!r}: the schema file is not registered (register it, or "
                "set TXSTAGE_REGISTRY_AUTO_REGISTER=true)")
    return None
