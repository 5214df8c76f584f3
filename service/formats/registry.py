"""The schema registry as the codecs use it: confluent-kafka's ``SchemaRegistryClient``
behind a cache of our own, so a schema id or an output subject costs one lookup for the
life of the process, and every failure sorted once: the registry's (unreachable, 5xx,
time-out: :class:`RegistryUnavailable`, the partition waits) or the record's (an unknown
id: :class:`UndecodableError`, a dead letter)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka.schema_registry import RegisteredSchema, Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from service.format_settings import FormatSettings
from service.formats.errors import RegistryError, RegistryUnavailable

T = TypeVar("T")
# httpx logs every request at INFO: one line per schema looked up is noise.
logging.getLogger("httpx2").setLevel(logging.WARNING)
logging.getLogger("httpx").setLevel(logging.WARNING)
# A lookup the stage runs beside the loop asks for this long before the held records are
# tried again (and, the registry still down, held again).
LOOKUP_WINDOW_S = 5.0
_RETRY_PAUSE_S = 0.25
_NOT_FOUND = (404,)


def client_config(settings: FormatSettings) -> dict[str, Any]:
    """The client's settings: URL, basic auth, TLS; no retries of its own (a lookup that
    fails is asked again beside the loop, while the partition waits)."""
    conf: dict[str, Any] = {"url": settings.registry_url, "timeout": settings.registry_timeout_s,
                            "max.retries": 0}
    auth = settings.registry_basic_auth_user_info.get_secret_value()
    if auth:
        conf["basic.auth.user.info"] = auth
    for prop, value in (("ssl.ca.location", settings.registry_ssl_ca_location),
                        ("ssl.certificate.location", settings.registry_ssl_certificate_location),
                        ("ssl.key.location", settings.registry_ssl_key_location)):
        if value:
            conf[prop] = value
    return conf


def unavailable(exc: BaseException) -> bool:
    """The registry's fault, not the record's: no answer (connection, time-out: httpx's
    errors), an answer that is not the registry's (not JSON: a proxy, a starting server),
    or any error status but "not found" (5xx, 429, and 401/403 too: a credential being
    rotated must hold records, never dead-letter them)."""
    if isinstance(exc, SchemaRegistryError):
        return exc.http_status_code not in _NOT_FOUND
    return type(exc).__module__.split(".")[0].startswith("httpx") \
        or isinstance(exc, OSError | ValueError)


def not_found(exc: BaseException) -> bool:
    return isinstance(exc, SchemaRegistryError) and exc.http_status_code in _NOT_FOUND


class Registry:
    """Cached lookups; ``on_state(up)`` is told when the registry stops or starts
    answering (the readiness and the ``txstage_schema_registry_up`` gauge)."""

    def __init__(self, settings: FormatSettings, *, client: SchemaRegistryClient | None = None,
                 on_state: Callable[[bool], None] | None = None) -> None:
        self.settings = settings
        self.client = client if client is not None else SchemaRegistryClient.new_client(
            client_config(settings))
        self.on_state = on_state
        self.up = True
        self.last_error: BaseException | None = None
        self._cache: dict[object, object] = {}
        self._lock = threading.Lock()  # a lookup job runs beside the loop

    def schema(self, schema_id: int) -> Schema:
        """The schema of ``schema_id`` (raises :class:`SchemaRegistryError` 404 if unknown)."""
        return self.cached(("id", schema_id), f"schema id {schema_id}",
                           lambda: self.client.get_schema(schema_id))

    def cached(self, key: object, what: str, fetch: Callable[[], T]) -> T:
        """``fetch()`` once per ``key``; the registry not answering raises
        :class:`RegistryUnavailable`, whose lookup asks again for a while."""
        found = self._cache.get(key, _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        if not self.up and self.last_error is not None:
            # Known down: the loop thread does not wait for another time-out; the lookup
            # beside the loop asks, and says when it answers again.
            raise RegistryUnavailable(what, lambda: self.wait_for(key, fetch),
                                      self.last_error)
        try:
            return self._fetch(key, fetch)
        except Exception as exc:
            if not unavailable(exc):
                raise
            self.last_error = exc
            self._state(up=False)
            raise RegistryUnavailable(what, lambda: self.wait_for(key, fetch), exc) from exc

    def wait_for(self, key: object, fetch: Callable[[], object],
                 window_s: float = LOOKUP_WINDOW_S) -> bool:
        """Ask until the registry answers (True) or ``window_s`` has passed (False). An
        answer that is an error (an unknown id) ends the wait too: the record is tried
        again and meets it."""
        deadline = time.monotonic() + window_s
        while True:
            try:
                self._fetch(key, fetch)
                return True
            except Exception as exc:
                if not unavailable(exc):
                    self._state(up=True)
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(_RETRY_PAUSE_S)

    def blocking(self, what: str, fetch: Callable[[], T], deadline_s: float = 60.0) -> T:
        """For start-up checks and tools: ask until the registry answers or the deadline."""
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                return fetch()
            except Exception as exc:
                if not unavailable(exc) or time.monotonic() >= deadline:
                    raise RegistryError(f"schema registry {self.settings.registry_url}: "
                                        f"{what}: {type(exc).__name__}: {exc}") from exc
                time.sleep(_RETRY_PAUSE_S)

    def _fetch(self, key: object, fetch: Callable[[], T]) -> T:
        value = fetch()
        with self._lock:
            self._cache[key] = value
        self._state(up=True)
        return value

    def _state(self, *, up: bool) -> None:
        if up != self.up:
            self.up = up
            if self.on_state is not None:
                self.on_state(up)

    def latest(self, subject: str) -> RegisteredSchema:
        return self.client.get_latest_version(subject)


_MISSING = object()
