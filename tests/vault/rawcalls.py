"""Speak to a real vault below the client library: raw gRPC calls with hand-built bytes, and the bulk port."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Mapping

import grpc

from tierkv.wire import SERVICE, FrameDecoder, bulk, encode_frames, pb

Ident = lambda b: b


def metadata(token: str | None) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")] if token else []


def unary(channel: grpc.Channel, method: str, request: bytes, token: str | None = None) -> bytes:
    call = channel.unary_unary(f"/{SERVICE}/{method}", Ident, Ident)
    return bytes(call(request, timeout=10, metadata=metadata(token)))


def put(
    channel: grpc.Channel,
    namespace: bytes,
    blobs: Mapping[bytes, bytes],
    token: str | None = None,
    *,
    timeout: float = 30,
) -> pb.PutReply:
    from tierkv.wire import Blob

    frames = encode_frames(
        [Blob(key=k, data=v) for k, v in blobs.items()], frame_bytes=1 << 20, namespace=namespace
    )
    call = channel.stream_unary(f"/{SERVICE}/Put", Ident, Ident)
    return pb.PutReply.FromString(call(frames, timeout=timeout, metadata=metadata(token)))


def get(
    channel: grpc.Channel, namespace: bytes, keys: list[bytes], token: str | None = None
) -> list[bytes | None]:
    call = channel.unary_stream(f"/{SERVICE}/BatchGet", Ident, Ident)
    request = pb.BatchGetRequest(namespace=namespace, keys=keys).SerializeToString()
    decoder = FrameDecoder(max_item_bytes=1 << 30)
    out: list[bytes | None] = [None] * len(keys)
    for frame in call(request, timeout=30, metadata=metadata(token)):
        for blob in decoder.feed(frame):
            if blob.status == pb.FOUND and blob.data is not None:
                out[blob.index] = bytes(blob.data)
    return out


def stats(channel: grpc.Channel, token: str | None = None) -> pb.StatsReply:
    return pb.StatsReply.FromString(unary(channel, "Stats", b"", token))


def code_of(fn, *args, **kwargs) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    """The status code a call ends with (OK when it returns)."""
    try:
        result = fn(*args, **kwargs)
        if hasattr(result, "__iter__") and not isinstance(result, bytes | list | pb.PutReply):
            list(result)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def bulk_records(
    port: int, request: bytes, *, timeout: float = 10, half_close: bool = False
) -> list[tuple[int, bytes]]:
    """One raw tierkv-bulk/1 exchange: the (kind, payload) records up to END or ERROR (or EOF).
    ``half_close`` ends the sending side, so a request cut short is not waited for."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        # The vault may answer a bad request with ERROR and close before all of it is sent or before the
        # half-close: what it sent is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        if half_close:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
        return read_records(sock)


def read_records(sock: socket.socket) -> list[tuple[int, bytes]]:
    """The (kind, payload) records of one reply on an open connection, up to END or ERROR (or EOF)."""
    records = []
    stream = sock.makefile("rb")
    while True:
        try:
            head = stream.read(bulk.RECORD.size)
        except ConnectionResetError:  # closed on a request it would not read further
            return records
        if len(head) < bulk.RECORD.size:
            return records
        kind, length = bulk.RECORD.unpack(head)
        records.append((kind, stream.read(length)))
        if kind in (bulk.END, bulk.ERROR):
            return records
