"""The fault proxy (tests/harness/proxy.py) without Kafka: its request parsing, on
requests encoded as Kafka's message schemas say, and its faults between a plain socket
client and a fake broker that answers every request. (Against a real broker:
tests/integration/test_fault_proxy.py.)"""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.local_kafka.node import free_ports
from service.local_kafka.properties import broker_properties
from tests.harness.proxy import Api, FaultKind, FaultProxy, parse_request

# ------------------------------------------------------------------------- encoding


def _string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _compact(text: str | None) -> bytes:
    if text is None:
        return _uvarint(0)
    data = text.encode()
    return _uvarint(len(data) + 1) + data


def request(api: int, version: int, correlation_id: int, client_id: str | None,
            body: bytes = b"", *, flexible: bool = False) -> bytes:
    """A request as a client sends it, size prefix included. Flexible versions use
    request header v2: the same client id encoding, then (here: one) tagged field."""
    header = struct.pack(">hhi", api, version, correlation_id) + _string(client_id)
    if flexible:
        header += _uvarint(1) + _uvarint(0) + _uvarint(3) + b"tag"
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def end_txn(version: int, transactional_id: str, commit: bool, correlation_id: int = 7,
            client_id: str | None = "client") -> bytes:
    flexible = version >= 3
    body = ((_compact(transactional_id) if flexible else _string(transactional_id))
            + struct.pack(">qh?", 1234, 5, commit) + (_uvarint(0) if flexible else b""))
    return request(Api.END_TXN, version, correlation_id, client_id, body, flexible=flexible)


def test_end_txn_non_flexible_and_flexible() -> None:
    for version in (0, 1, 2, 3, 4, 5):
        parsed = parse_request(end_txn(version, "g.topic.0", version % 2 == 0)[4:])
        assert parsed.parse_error is None, version
        assert (parsed.api_key, parsed.api_version, parsed.correlation_id) == \
            (Api.END_TXN, version, 7)
        assert parsed.client_id == "client"
        assert parsed.transactional_id == "g.topic.0"
        assert parsed.commit is (version % 2 == 0)


def test_transactional_ids_of_every_transactional_api() -> None:
    cases = [
        # (api, version, body, flexible, expected id)
        (Api.INIT_PRODUCER_ID, 1, _string(None) + struct.pack(">i", 60000), False, None),
        (Api.INIT_PRODUCER_ID, 4, _compact("tx") + struct.pack(">i", 60000), True, "tx"),
        (Api.ADD_OFFSETS_TO_TXN, 2, _string("tx") + struct.pack(">qh", 1, 0), False, "tx"),
        (Api.ADD_OFFSETS_TO_TXN, 3, _compact("tx") + struct.pack(">qh", 1, 0), True, "tx"),
        (Api.TXN_OFFSET_COMMIT, 3, _compact("tx") + _compact("group"), True, "tx"),
        (Api.ADD_PARTITIONS_TO_TXN, 1, _string("tx") + struct.pack(">qh", 1, 0), False, "tx"),
        (Api.ADD_PARTITIONS_TO_TXN, 3, _compact("tx") + struct.pack(">qh", 1, 0), True, "tx"),
        # v4+: a batch (compact array of transactions, each led by its id)
        (Api.ADD_PARTITIONS_TO_TXN, 4, _uvarint(3) + _compact("tx") + _compact("other"),
         True, "tx"),
        (Api.PRODUCE, 2, struct.pack(">hi", -1, 30000), False, None),  # no id before v3
        (Api.PRODUCE, 7, _string("tx") + struct.pack(">hi", -1, 30000), False, "tx"),
        (Api.PRODUCE, 9, _compact("tx") + struct.pack(">hi", -1, 30000), True, "tx"),
        (Api.PRODUCE, 10, _compact(None) + struct.pack(">hi", -1, 30000), True, None),
        (Api.FETCH, 12, b"\x00\x01\x02", True, None),  # no transactional id to look for
    ]
    for api, version, body, flexible, expected in cases:
        parsed = parse_request(request(api, version, 1, "c", body, flexible=flexible)[4:])
        assert parsed.parse_error is None, (api, version)
        assert parsed.transactional_id == expected, (api, version)
        assert parsed.client_id == "c"


def test_a_null_client_id_and_garbage_never_raise() -> None:
    parsed = parse_request(request(Api.METADATA, 12, 9, None)[4:])
    assert (parsed.api_key, parsed.correlation_id, parsed.client_id) == (Api.METADATA, 9, None)
    truncated = parse_request(end_txn(3, "g.topic.0", True)[4:20])
    assert truncated.api_key == Api.END_TXN and truncated.parse_error
    assert parse_request(b"\x00").parse_error


def test_a_proxied_node_advertises_the_proxy_and_keeps_a_direct_listener() -> None:
    props = broker_properties(node_id=0, broker_port=9000, controller_port=9100,
                              controller_ports={0: 9100}, log_dir=Path("/data"),
                              advertised_port=9200, direct_port=9300)
    assert props["listeners"] == ("PLAINTEXT://127.0.0.1:9000,DIRECT://127.0.0.1:9300,"
                                  "CONTROLLER://127.0.0.1:9100")
    assert props["advertised.listeners"] == \
        "PLAINTEXT://127.0.0.1:9200,DIRECT://127.0.0.1:9300"
    assert props["inter.broker.listener.name"] == "DIRECT"
    assert "DIRECT:PLAINTEXT" in props["listener.security.protocol.map"].split(",")
    plain = broker_properties(node_id=0, broker_port=9000, controller_port=9100,
                              controller_ports={0: 9100}, log_dir=Path("/data"))
    assert plain["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9000"
    assert plain["inter.broker.listener.name"] == "PLAINTEXT"


# ---------------------------------------------------------------------- fake broker


class FakeBroker(socketserver.ThreadingTCPServer):
    """Answers every request at once with its correlation id and b"ok"; keeps what it
    received (payloads, in order, with the time)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Answer)
        self.received: list[tuple[float, bytes]] = []


class _Answer(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, FakeBroker)
        sock: socket.socket = self.request
        while True:
            size = _read(sock, 4)
            if size is None:
                return
            payload = _read(sock, struct.unpack(">i", size)[0])
            if payload is None:
                return
            server.received.append((time.monotonic(), payload))
            answer = payload[4:8] + b"ok"
            sock.sendall(struct.pack(">i", len(answer)) + answer)


def _read(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


class Client:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self) -> int | None:
        """The correlation id of the next response; None when the connection closed."""
        size = _read(self.sock, 4)
        if size is None:
            return None
        payload = _read(self.sock, struct.unpack(">i", size)[0])
        return None if payload is None else int(struct.unpack(">i", payload[:4])[0])

    def timed(self, data: bytes) -> tuple[int | None, float]:
        started = time.monotonic()
        self.send(data)
        return self.answer(), time.monotonic() - started

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    server = FakeBroker()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(broker: FakeBroker) -> Iterator[FaultProxy]:
    port = free_ports(1)[0]
    with FaultProxy({port: ("127.0.0.1", broker.server_address[1])}) as running:
        yield running


@pytest.fixture
def client(proxy: FaultProxy) -> Iterator[Client]:
    connected = Client(next(iter(proxy.routes)))
    yield connected
    connected.close()


def heartbeat(correlation_id: int, client_id: str = "client") -> bytes:
    return request(Api.HEARTBEAT, 4, correlation_id, client_id, _compact("g") + b"\x00",
                   flexible=True)


def test_requests_and_responses_pass_unchanged(broker: FakeBroker, proxy: FaultProxy,
                                               client: Client) -> None:
    sent = [heartbeat(1), end_txn(1, "tx", True, correlation_id=2), heartbeat(3)]
    for data in sent:
        client.send(data)
    assert [client.answer() for _ in sent] == [1, 2, 3]
    assert [payload for _, payload in broker.received] == [data[4:] for data in sent]
    assert proxy.seen(Api.END_TXN, "tx") == 1 and proxy.seen(Api.HEARTBEAT) == 2
    assert proxy.applied == []


def test_delayed_response_of_one_transactional_id_only_count_times(
        proxy: FaultProxy, client: Client) -> None:
    fault = proxy.delay_response(Api.END_TXN, 0.5, transactional_id="tx", count=1)
    assert client.timed(end_txn(3, "other", True, correlation_id=1))[1] < 0.3
    assert client.timed(heartbeat(2))[1] < 0.3
    answer, took = client.timed(end_txn(3, "tx", False, correlation_id=3))
    assert answer == 3 and took >= 0.5
    assert client.timed(end_txn(3, "tx", True, correlation_id=4))[1] < 0.3  # count=1
    [applied] = proxy.applied_to(fault)
    assert (applied.kind, applied.api_key, applied.correlation_id, applied.transactional_id,
            applied.commit, applied.client_id, applied.delivered) == \
        (FaultKind.DELAY_RESPONSE, Api.END_TXN, 3, "tx", False, "client", True)
    assert applied.held_s is not None and applied.held_s >= 0.5


def test_delayed_request_reaches_the_broker_late_and_holds_the_ones_behind_it(
        broker: FakeBroker, proxy: FaultProxy, client: Client) -> None:
    proxy.delay_request(Api.END_TXN, 0.5)
    started = time.monotonic()
    client.send(end_txn(3, "tx", True, correlation_id=1))
    client.send(heartbeat(2))
    assert [client.answer(), client.answer()] == [1, 2]  # order kept
    assert [round(at - started, 1) >= 0.5 for at, _ in broker.received] == [True, True]


def test_drop_on_request_never_reaches_the_broker(broker: FakeBroker, proxy: FaultProxy,
                                                  client: Client) -> None:
    fault = proxy.drop_connection(Api.PRODUCE, on="request", client_id="prod*")
    client.send(heartbeat(1, client_id="producer-1"))
    assert client.answer() == 1
    client.send(request(Api.PRODUCE, 9, 2, "producer-1", _compact(None) + b"\x00" * 6,
                        flexible=True))
    assert client.answer() is None  # closed
    assert len(broker.received) == 1
    assert [a.kind for a in proxy.applied_to(fault)] == [FaultKind.DROP_REQUEST]


def test_drop_on_response_after_the_broker_acted(broker: FakeBroker, proxy: FaultProxy,
                                                 client: Client) -> None:
    fault = proxy.drop_connection(Api.END_TXN, on="response", transactional_id="tx")
    client.send(end_txn(3, "tx", True, correlation_id=5))
    assert client.answer() is None
    assert len(broker.received) == 1  # it got there; its answer did not come back
    assert [(a.kind, a.correlation_id) for a in proxy.applied_to(fault)] == \
        [(FaultKind.DROP_RESPONSE, 5)]
    again = Client(next(iter(proxy.routes)))  # unlimited: the next connection too
    try:
        again.send(end_txn(3, "tx", True, correlation_id=6))
        assert again.answer() is None
        proxy.clear(fault)
        third = Client(next(iter(proxy.routes)))
        assert third.timed(end_txn(3, "tx", True, correlation_id=7))[0] == 7
        third.close()
    finally:
        again.close()


def test_blackhole_holds_everything_until_it_ends_or_is_cleared(
        broker: FakeBroker, proxy: FaultProxy, client: Client) -> None:
    fault = proxy.blackhole(0.6)
    answer, took = client.timed(heartbeat(1))
    assert answer == 1 and took >= 0.55
    assert client.timed(heartbeat(2))[1] < 0.3  # over
    proxy.blackhole(None)  # until cleared
    client.send(heartbeat(3))
    time.sleep(0.3)
    assert len(broker.received) == 2, "a blackholed request reached the broker"
    proxy.clear()
    assert client.answer() == 3
    records = proxy.applied_to(fault)
    assert records and records[0].kind is FaultKind.BLACKHOLE and records[0].delivered


def test_a_filtered_blackhole_catches_connections_from_their_first_matching_request(
        broker: FakeBroker, proxy: FaultProxy, client: Client) -> None:
    proxy.blackhole(0.5, api=Api.FIND_COORDINATOR)
    assert client.timed(heartbeat(1))[1] < 0.3
    other = Client(next(iter(proxy.routes)))
    try:
        find = request(Api.FIND_COORDINATOR, 4, 2, "client", b"\x01", flexible=True)
        assert other.timed(find)[1] >= 0.45
        assert client.timed(heartbeat(3))[1] < 0.3  # the first connection was never caught
    finally:
        other.close()


def test_a_fault_with_a_duration_expires_and_clearing_releases_a_held_response(
        proxy: FaultProxy, client: Client) -> None:
    proxy.delay_response(Api.HEARTBEAT, 0.4, duration_s=0.2)
    assert client.timed(heartbeat(1))[1] >= 0.4
    time.sleep(0.25)
    assert client.timed(heartbeat(2))[1] < 0.3
    long = proxy.delay_response(Api.HEARTBEAT, 30)
    client.send(heartbeat(3))
    proxy.wait_applied(long, 1, timeout=5)
    proxy.clear(long)
    started = time.monotonic()
    assert client.answer() == 3
    assert time.monotonic() - started < 1
    [held] = proxy.wait_applied(long, 1, timeout=5, released=True)
    assert held.held_s is not None and held.held_s < 5


def test_a_held_response_whose_client_went_away_is_logged_as_not_delivered(
        proxy: FaultProxy) -> None:
    fault = proxy.delay_response(Api.HEARTBEAT, 30)
    leaving = Client(next(iter(proxy.routes)))
    leaving.send(heartbeat(1))
    proxy.wait_applied(fault, 1, timeout=5)
    leaving.close()
    [record] = proxy.wait_applied(fault, 1, timeout=5, released=True)
    assert record.delivered is False
    proxy.clear()


def test_a_taken_port_fails_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proxy = FaultProxy({taken.getsockname()[1]: ("127.0.0.1", 1)})
        with pytest.raises(OSError):
            proxy.start()
        assert not proxy.running
