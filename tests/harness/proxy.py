"""A Kafka-protocol-aware TCP fault proxy: plain asyncio, standard library only.

The proxy sits between Kafka clients and brokers (see ``KafkaCluster(proxied=True)``:
the brokers advertise the proxy's ports to clients, while a second listener stays
direct for verifiers). It forwards bytes both ways, frames every request (4-byte size,
then the request header: api_key, api_version, correlation_id, client_id) and matches
each response to its request by correlation id, so faults can target one API of one
client, or of one transactional producer::

    with FaultProxy({proxy_port: ("127.0.0.1", broker_port)}) as proxy:
        fault = proxy.delay_response(Api.END_TXN, 10.0, transactional_id="g.in.0")
        ...
        proxy.clear(fault)
        assert proxy.applied_to(fault)

Faults (each a :class:`Fault`, selectable by API key, transactional id and client id;
the ids match as ``fnmatch`` patterns, so an exact id matches itself):

- ``delay_request``: hold a matching request ``seconds`` before the broker gets it;
- ``delay_response``: forward the request, hold its response ``seconds``;
- ``drop_connection(on="request")``: close the connection when a matching request
  arrives; the broker never sees it;
- ``drop_connection(on="response")``: forward the request and close the connection
  when its response arrives, so the broker acted on a request whose outcome the
  client never learns (the "unknown outcome" case);
- ``blackhole``: for ``seconds``, hold every byte in both directions on matching
  connections (with no filter: every connection, new ones too); then release it,
  as TCP would after a network partition heals.

A fault lasts until ``duration_s`` has passed, it was applied ``count`` times, or it is
cleared (:meth:`FaultProxy.clear`); a cleared fault also releases what it holds. Every
application is an :class:`Applied` record in :attr:`FaultProxy.applied` (and a log line
on the ``txstage.proxy`` logger), with when the held bytes were released.

Order is kept per connection and direction (Kafka's protocol needs it): holding one
request or response holds the ones behind it on the same connection, nothing else.

The proxy runs in a background thread with its own event loop; every public method is
thread-safe and meant to be called from the test's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fnmatch
import functools
import itertools
import logging
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType

__all__ = [
    "Api",
    "Applied",
    "Fault",
    "FaultKind",
    "FaultProxy",
    "RequestHeader",
    "parse_request",
]

log = logging.getLogger("txstage.proxy")


class Api(enum.IntEnum):
    """Kafka API keys the faults are usually aimed at (any int works too)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    API_VERSIONS = 18
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    CONSUMER_GROUP_HEARTBEAT = 68


def api_name(api_key: int) -> str:
    try:
        return Api(api_key).name
    except ValueError:
        return f"API_{api_key}"


class FaultKind(enum.StrEnum):
    DELAY_REQUEST = "delay_request"
    DELAY_RESPONSE = "delay_response"
    DROP_REQUEST = "drop_request"
    DROP_RESPONSE = "drop_response"
    BLACKHOLE = "blackhole"


# ------------------------------------------------------------------------------ parsing

# The first request version with a flexible encoding (compact strings, tagged fields in
# the header and body), for the APIs whose body starts with a transactional id. From
# Kafka 4.1's clients/src/main/resources/common/message/*Request.json ("flexibleVersions"):
# Produce "9+" (TransactionalId: nullable string, versions "3+"), InitProducerId "2+"
# (nullable string), AddPartitionsToTxn "3+" (v0-3 V3AndBelowTransactionalId: string;
# v4+ a Transactions array whose entries start with TransactionalId), AddOffsetsToTxn,
# EndTxn and TxnOffsetCommit "3+" (TransactionalId: string, first field).
_FLEXIBLE_FROM: dict[int, int] = {
    Api.PRODUCE: 9,
    Api.INIT_PRODUCER_ID: 2,
    Api.ADD_PARTITIONS_TO_TXN: 3,
    Api.ADD_OFFSETS_TO_TXN: 3,
    Api.END_TXN: 3,
    Api.TXN_OFFSET_COMMIT: 3,
}


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """What the proxy read of one request."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int
    transactional_id: str | None = None
    # EndTxn only: True = commit, False = abort.
    commit: bool | None = None
    parse_error: str | None = None

    @property
    def api(self) -> str:
        return api_name(self.api_key)


class _Reader:
    """Kafka primitive types at a moving position of one payload."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(f"{n} bytes wanted at {self.pos}, payload has {len(self.data)}")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def int8(self) -> int:
        value: int = struct.unpack(">b", self.take(1))[0]
        return value

    def int16(self) -> int:
        value: int = struct.unpack(">h", self.take(2))[0]
        return value

    def int32(self) -> int:
        value: int = struct.unpack(">i", self.take(4))[0]
        return value

    def int64(self) -> int:
        value: int = struct.unpack(">q", self.take(8))[0]
        return value

    def uvarint(self) -> int:
        result, shift = 0, 0
        while True:
            byte = self.take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 28:
                raise ValueError("unsigned varint longer than 5 bytes")

    def string(self, *, flexible: bool) -> str | None:
        """A (nullable) string: int16 length (-1 null), or in flexible versions a
        compact string, unsigned varint length + 1 (0 null)."""
        length = self.uvarint() - 1 if flexible else self.int16()
        return None if length < 0 else self.take(length).decode("utf-8", "replace")

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())


def parse_request(payload: bytes) -> RequestHeader:
    """The header of one request (``payload``: the bytes after the size), and for the
    transactional APIs the body's leading transactional id. Never raises: what cannot
    be parsed is left out and named in ``parse_error``."""
    reader = _Reader(payload)
    try:
        api_key, api_version, correlation_id = reader.int16(), reader.int16(), reader.int32()
    except ValueError as exc:
        return RequestHeader(-1, -1, -1, None, len(payload), parse_error=str(exc))
    header = RequestHeader(api_key, api_version, correlation_id, None, len(payload))
    try:
        # Request header v1/v2: client_id is a nullable *non-compact* string in both
        # (RequestHeader.json: "flexibleVersions": "none" for ClientId).
        header = replace(header, client_id=reader.string(flexible=False))
        flexible_from = _FLEXIBLE_FROM.get(api_key)
        if flexible_from is None:
            return header
        flexible = api_version >= flexible_from
        if flexible:
            reader.skip_tagged_fields()  # request header v2
        return _parse_body(header, reader, flexible)
    except ValueError as exc:
        return replace(header, parse_error=str(exc))


def _parse_body(header: RequestHeader, reader: _Reader, flexible: bool) -> RequestHeader:
    key, version = header.api_key, header.api_version
    if key == Api.PRODUCE:
        if version < 3:
            return header
        return replace(header, transactional_id=reader.string(flexible=flexible))
    if key == Api.ADD_PARTITIONS_TO_TXN and version >= 4:
        # Transactions (compact array); report the first entry's id.
        if reader.uvarint() - 1 <= 0:
            return header
        return replace(header, transactional_id=reader.string(flexible=True))
    transactional_id = reader.string(flexible=flexible)
    if key == Api.END_TXN:
        reader.int64()  # producer id
        reader.int16()  # producer epoch
        return replace(header, transactional_id=transactional_id, commit=reader.int8() != 0)
    return replace(header, transactional_id=transactional_id)


# ------------------------------------------------------------------------------- faults


@dataclass(eq=False)
class Fault:
    """One fault; returned by the adding methods, accepted by :meth:`FaultProxy.clear`.

    ``api_keys``, ``transactional_id`` and ``client_id`` select requests (None: any). A
    request without a transactional id never matches a fault that names one.
    """

    kind: FaultKind
    api_keys: frozenset[int] | None = None
    transactional_id: str | None = None
    client_id: str | None = None
    seconds: float = 0.0  # how long a delay holds (blackhole: see duration_s)
    duration_s: float | None = None  # active this long after it was added
    count: int | None = None  # applied at most this often (blackhole: connections)
    id: int = 0
    added_at: float = 0.0
    applied: int = 0
    cleared: bool = False

    def __post_init__(self) -> None:
        if self.seconds < 0 or (self.duration_s is not None and self.duration_s < 0):
            raise ValueError("seconds and duration_s must not be negative")
        if self.count is not None and self.count < 1:
            raise ValueError("count must be at least 1")

    @property
    def filtered(self) -> bool:
        return not (self.api_keys is None and self.transactional_id is None
                    and self.client_id is None)

    def expired(self, now: float) -> bool:
        return self.cleared or (self.duration_s is not None
                                and now >= self.added_at + self.duration_s)

    def can_apply(self, now: float) -> bool:
        return not self.expired(now) and (self.count is None or self.applied < self.count)

    def matches(self, request: RequestHeader) -> bool:
        if self.api_keys is not None and request.api_key not in self.api_keys:
            return False
        if self.transactional_id is not None and (
                request.transactional_id is None
                or not fnmatch.fnmatchcase(request.transactional_id, self.transactional_id)):
            return False
        return self.client_id is None or (
            request.client_id is not None
            and fnmatch.fnmatchcase(request.client_id, self.client_id))

    def __str__(self) -> str:
        apis = "any" if self.api_keys is None else ",".join(
            api_name(k) for k in sorted(self.api_keys))
        parts = [f"#{self.id} {self.kind.value} api={apis}"]
        if self.transactional_id is not None:
            parts.append(f"txn={self.transactional_id}")
        if self.client_id is not None:
            parts.append(f"client={self.client_id}")
        if self.kind in (FaultKind.DELAY_REQUEST, FaultKind.DELAY_RESPONSE):
            parts.append(f"{self.seconds:g}s")
        if self.duration_s is not None:
            parts.append(f"for {self.duration_s:g}s")
        if self.count is not None:
            parts.append(f"x{self.count}")
        return " ".join(parts)


@dataclass
class Applied:
    """One application of a fault. Times are ``time.monotonic()``. A hold (delay,
    blackhole) ends at ``released_at`` (None while it lasts), ``delivered`` saying
    whether the held bytes then went on (True) or the connection had closed first
    (False: e.g. the client timed the request out). Drops hold nothing."""

    fault_id: int
    kind: FaultKind
    at: float
    connection: int
    port: int
    api_key: int | None
    api_version: int | None
    correlation_id: int | None
    client_id: str | None
    transactional_id: str | None
    commit: bool | None = None
    released_at: float | None = None
    delivered: bool | None = None

    @property
    def api(self) -> str:
        return "-" if self.api_key is None else api_name(self.api_key)

    @property
    def held_s(self) -> float | None:
        return None if self.released_at is None else self.released_at - self.at

    def __str__(self) -> str:
        what = "" if self.commit is None else ("(commit)" if self.commit else "(abort)")
        held = "" if self.held_s is None else f" held {self.held_s:.2f}s" + (
            "" if self.delivered else " (connection closed meanwhile: not delivered)")
        return (f"fault #{self.fault_id} {self.kind.value}: {self.api}{what} "
                f"v{self.api_version} corr={self.correlation_id} conn={self.connection} "
                f"port={self.port} client={self.client_id} txn={self.transactional_id}{held}")


def _api_set(api: int | Iterable[int] | None) -> frozenset[int] | None:
    if api is None:
        return None
    if isinstance(api, int):
        return frozenset({int(api)})
    return frozenset(int(key) for key in api)


# ------------------------------------------------------------------------ the proxy

_POLL_S = 0.02  # how often a hold looks again at its fault (cleared? expired?)
_MAX_PENDING = 10_000  # requests without a response (acks=0) are forgotten past this


@dataclass(eq=False)
class _Connection:
    id: int
    port: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    # correlation id -> the request and the response faults it drew
    pending: dict[int, tuple[RequestHeader, list[Fault]]] = field(default_factory=dict)
    caught: set[int] = field(default_factory=set)  # blackholes holding this connection
    holds: dict[int, Applied] = field(default_factory=dict)  # blackhole id -> its record
    closed: bool = False

    def abort(self) -> None:
        self.closed = True
        for writer in (self.client, self.upstream):
            writer.transport.abort()


class _Dropped(Exception):
    """A drop fault closed the connection."""


class FaultProxy:
    """TCP proxies for Kafka brokers, ``{listen_port: (upstream_host, upstream_port)}``,
    served by one background event loop. Use as a context manager or start()/stop()."""

    def __init__(self, routes: Mapping[int, tuple[str, int]] | None = None, *,
                 host: str = "127.0.0.1") -> None:
        self.host = host
        self.routes = dict(routes or {})
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._applied: list[Applied] = []
        self._seen: Counter[tuple[int, str | None]] = Counter()
        self._ids = itertools.count(1)
        self._connection_ids = itertools.count(1)
        self._connections: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None

    # -- lifecycle ------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self, timeout: float = 10.0) -> FaultProxy:
        """Listen on every route; raises OSError if a port cannot be bound."""
        if self._thread is not None:
            raise RuntimeError("the proxy was started already")
        if not self.routes:
            raise ValueError("a proxy needs at least one route")
        self._thread = threading.Thread(target=self._run, name="kafka-fault-proxy",
                                        daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError("the fault proxy did not start")
        if self._start_error is not None:
            self._thread.join(timeout)
            self._thread = None
            raise self._start_error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listeners and every connection, end the thread. Safe to call twice."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended already
                loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout)
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            if not self._started.is_set():
                self._start_error = exc
                self._started.set()
            else:
                log.exception("fault proxy crashed")

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        servers: list[asyncio.Server] = []
        try:
            for port, upstream in self.routes.items():
                servers.append(await asyncio.start_server(
                    functools.partial(self._accept, port=port, upstream=upstream),
                    self.host, port, reuse_address=True))
        except BaseException as exc:
            for server in servers:
                server.close()
            self._start_error = exc
            self._started.set()
            return
        self._started.set()
        await self._stopping.wait()
        for server in servers:
            server.close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.abort()
        for server in servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    # -- faults -----------------------------------------------------------------------

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            fault.id = next(self._ids)
            fault.added_at = time.monotonic()
            self._faults.append(fault)
        log.info("fault added: %s", fault)
        return fault

    def delay_request(self, api: int | Iterable[int] | None, seconds: float, *,
                      transactional_id: str | None = None, client_id: str | None = None,
                      duration_s: float | None = None, count: int | None = None) -> Fault:
        return self.add(Fault(FaultKind.DELAY_REQUEST, _api_set(api), transactional_id,
                              client_id, seconds, duration_s, count))

    def delay_response(self, api: int | Iterable[int] | None, seconds: float, *,
                       transactional_id: str | None = None, client_id: str | None = None,
                       duration_s: float | None = None, count: int | None = None) -> Fault:
        return self.add(Fault(FaultKind.DELAY_RESPONSE, _api_set(api), transactional_id,
                              client_id, seconds, duration_s, count))

    def drop_connection(self, api: int | Iterable[int] | None, *, on: str = "request",
                        transactional_id: str | None = None, client_id: str | None = None,
                        duration_s: float | None = None, count: int | None = None) -> Fault:
        """``on="request"``: close before the broker sees the request; ``"response"``:
        after it acted on it, instead of passing its response on."""
        kinds = {"request": FaultKind.DROP_REQUEST, "response": FaultKind.DROP_RESPONSE}
        if on not in kinds:
            raise ValueError(f"on must be 'request' or 'response', not {on!r}")
        return self.add(Fault(kinds[on], _api_set(api), transactional_id, client_id,
                              0.0, duration_s, count))

    def blackhole(self, seconds: float | None, *, api: int | Iterable[int] | None = None,
                  transactional_id: str | None = None, client_id: str | None = None,
                  count: int | None = None) -> Fault:
        """Hold all traffic of matching connections for ``seconds`` (None: until
        cleared). Without a filter every connection is held at once; with one, a
        connection is held from its first matching request on (that one included)."""
        return self.add(Fault(FaultKind.BLACKHOLE, _api_set(api), transactional_id,
                              client_id, 0.0, seconds, count))

    def clear(self, fault: Fault | None = None) -> None:
        """End ``fault`` (None: every fault); what it holds goes on at once."""
        with self._lock:
            targets = list(self._faults) if fault is None else [fault]
            for target in targets:
                target.cleared = True
            self._faults = [f for f in self._faults if not f.cleared]
        for target in targets:
            log.info("fault cleared: %s (applied %d times)", target, target.applied)

    def reset(self) -> None:
        """Clear every fault and forget the applied records and request counts."""
        self.clear()
        with self._lock:
            self._applied.clear()
            self._seen.clear()

    @property
    def faults(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    @property
    def applied(self) -> list[Applied]:
        """Every application so far, oldest first (copies)."""
        with self._lock:
            return [replace(record) for record in self._applied]

    def applied_to(self, fault: Fault) -> list[Applied]:
        return [record for record in self.applied if record.fault_id == fault.id]

    def seen(self, api: int | None = None, transactional_id: str | None = None) -> int:
        """Requests forwarded or faulted so far, by API and/or transactional id."""
        with self._lock:
            return sum(n for (key, tid), n in self._seen.items()
                       if (api is None or key == api)
                       and (transactional_id is None or tid == transactional_id))

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    def wait_applied(self, fault: Fault, times: int = 1, timeout: float = 30.0, *,
                     released: bool = False) -> list[Applied]:
        """Until ``fault`` was applied ``times`` times (``released``: and those holds
        ended); its records. Raises TimeoutError with the log so far."""
        deadline = time.monotonic() + timeout
        while True:
            records = self.applied_to(fault)
            done = [r for r in records if not released or r.released_at is not None
                    or r.kind in (FaultKind.DROP_REQUEST, FaultKind.DROP_RESPONSE)]
            if len(done) >= times:
                return records
            if time.monotonic() > deadline:
                raise TimeoutError(f"fault {fault} applied {len(records)} of {times} times "
                                   f"within {timeout}s\n{self.describe()}")
            time.sleep(0.05)

    def describe(self) -> str:
        """The faults and the applied log, for assertion messages."""
        with self._lock:
            faults = [str(f) for f in self._faults]
            applied = [str(a) for a in self._applied]
        return "\n".join(["faults active: " + ("; ".join(faults) or "none"),
                          f"applied ({len(applied)}):", *applied[-200:]])

    # -- forwarding -------------------------------------------------------------------

    async def _accept(self, client_reader: asyncio.StreamReader,
                      client_writer: asyncio.StreamWriter, *, port: int,
                      upstream: tuple[str, int]) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*upstream)
        except OSError as exc:
            log.warning("port %d: upstream %s:%d refused: %s", port, *upstream, exc)
            client_writer.transport.abort()
            return
        connection = _Connection(next(self._connection_ids), port, client_writer,
                                 upstream_writer)
        with self._lock:
            self._connections.add(connection)
        pumps = [asyncio.create_task(self._requests(connection, client_reader)),
                 asyncio.create_task(self._responses(connection, upstream_reader))]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass  # the proxy stops: this task is the connection's top level, end quietly
        finally:
            connection.abort()
            for pump in pumps:
                pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*pumps, return_exceptions=True)
            self._release_holds(connection)
            with self._lock:
                self._connections.discard(connection)

    async def _requests(self, connection: _Connection, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, _Dropped):
            while True:
                size_bytes = await reader.readexactly(4)
                payload = await reader.readexactly(struct.unpack(">i", size_bytes)[0])
                request = parse_request(payload)
                faults = self._draw(connection, request)
                await self._hold_blackholed(connection, request)
                response_faults: list[Fault] = []
                for fault in faults:
                    if fault.kind is FaultKind.DROP_REQUEST:
                        self._record(fault, connection, request)
                        raise _Dropped
                    if fault.kind is FaultKind.DELAY_REQUEST:
                        await self._delay(fault, connection, request)
                    elif fault.kind in (FaultKind.DELAY_RESPONSE, FaultKind.DROP_RESPONSE):
                        response_faults.append(fault)
                if len(connection.pending) >= _MAX_PENDING:
                    connection.pending.clear()
                connection.pending[request.correlation_id] = (request, response_faults)
                connection.upstream.write(size_bytes + payload)
                await connection.upstream.drain()

    async def _responses(self, connection: _Connection, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, _Dropped):
            while True:
                size_bytes = await reader.readexactly(4)
                payload = await reader.readexactly(struct.unpack(">i", size_bytes)[0])
                correlation_id = struct.unpack_from(">i", payload)[0]
                request, faults = connection.pending.pop(correlation_id, (None, []))
                await self._hold_blackholed(connection)
                for fault in faults:
                    assert request is not None
                    if not self._take(fault):  # exhausted or cleared since the request
                        continue
                    if fault.kind is FaultKind.DROP_RESPONSE:
                        self._record(fault, connection, request)
                        raise _Dropped
                    await self._delay(fault, connection, request)
                connection.client.write(size_bytes + payload)
                await connection.client.drain()

    def _draw(self, connection: _Connection, request: RequestHeader) -> list[Fault]:
        """The faults this request draws. Request faults are counted as applied now;
        response faults when its response comes (:meth:`_take`), so that ``count``
        counts what was done (a dropped connection loses the responses behind it).
        Blackholes catch the connection instead."""
        now = time.monotonic()
        drawn = []
        with self._lock:
            self._seen[(request.api_key, request.transactional_id)] += 1
            for fault in self._faults:
                if not fault.can_apply(now) or not fault.matches(request):
                    continue
                if fault.kind is FaultKind.BLACKHOLE:
                    if fault.filtered and fault.id not in connection.caught:
                        connection.caught.add(fault.id)
                        fault.applied += 1
                    continue
                if fault.kind in (FaultKind.DELAY_REQUEST, FaultKind.DROP_REQUEST):
                    fault.applied += 1
                drawn.append(fault)
        return drawn

    def _take(self, fault: Fault) -> bool:
        """Count one application of a response fault, if it still may apply."""
        with self._lock:
            if not fault.can_apply(time.monotonic()):
                return False
            fault.applied += 1
            return True

    def _record(self, fault: Fault, connection: _Connection,
                request: RequestHeader | None) -> Applied:
        record = Applied(
            fault.id, fault.kind, time.monotonic(), connection.id, connection.port,
            request.api_key if request else None, request.api_version if request else None,
            request.correlation_id if request else None, request.client_id if request else None,
            request.transactional_id if request else None, request.commit if request else None)
        with self._lock:
            self._applied.append(record)
        log.info("%s", record)
        return record

    def _released(self, record: Applied, connection: _Connection) -> None:
        with self._lock:
            if record.released_at is not None:
                return
            record.released_at = time.monotonic()
            record.delivered = not connection.closed
        log.info("released: %s", record)

    async def _delay(self, fault: Fault, connection: _Connection,
                     request: RequestHeader) -> None:
        record = self._record(fault, connection, request)
        until = record.at + fault.seconds
        try:
            while not fault.cleared and not connection.closed:
                left = until - time.monotonic()
                if left <= 0:
                    break
                await asyncio.sleep(min(left, _POLL_S))
        finally:  # also when the connection closes while holding (the pump is cancelled)
            self._released(record, connection)

    def _holding(self, connection: _Connection) -> list[Fault]:
        """The blackholes holding this connection now. An unfiltered one takes every
        connection (up to ``count`` of them), counted when it first holds it."""
        now = time.monotonic()
        holding = []
        with self._lock:
            for fault in self._faults:
                if fault.kind is not FaultKind.BLACKHOLE or fault.expired(now):
                    continue
                if fault.filtered:
                    if fault.id in connection.caught:
                        holding.append(fault)
                elif fault.id in connection.holds or fault.can_apply(now):
                    if fault.id not in connection.holds:
                        fault.applied += 1
                    holding.append(fault)
        return holding

    async def _hold_blackholed(self, connection: _Connection,
                               request: RequestHeader | None = None) -> None:
        while not connection.closed:
            holding = self._holding(connection)
            for fault in holding:
                if fault.id not in connection.holds:
                    connection.holds[fault.id] = self._record(fault, connection, request)
            self._release_holds(connection, keep={f.id for f in holding})
            if not holding:
                return
            await asyncio.sleep(_POLL_S)

    def _release_holds(self, connection: _Connection, keep: set[int] | None = None) -> None:
        for fault_id, record in list(connection.holds.items()):
            if keep is None or fault_id not in keep:
                self._released(record, connection)
                if keep is not None:  # the blackhole ended: never hold again
                    connection.caught.discard(fault_id)
