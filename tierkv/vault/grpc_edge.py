"""The gRPC front end of the vault: registers the methods, maps outcomes to ``grpc.StatusCode``.

All methods use identity (de)serializers and are parsed by the service, so malformed bytes become
INVALID_ARGUMENT (a protobuf parse failure inside gRPC would surface as INTERNAL). This is the only vault
module that knows gRPC's status codes; the token comes from ``authorization: Bearer <token>``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import Message

from tierkv.vault.auth import Principal, bearer_token
from tierkv.vault.memory import InflightBudget
from tierkv.vault.service import VaultService, parse_canonical, parse_message
from tierkv.vault.status import Abort, Status
from tierkv.wire import SERVICE, pb

M = TypeVar("M", bound=Message)
GRPC_CODES = {status: getattr(grpc.StatusCode, status.name) for status in Status}


def handler(service: VaultService, budget: InflightBudget) -> grpc.GenericRpcHandler[Any, Any]:
    """The Vault methods; Put frames count against ``budget`` until the store has written them."""
    ident: Callable[[Any], Any] = _identity
    unary = {
        "PrefixLookup": _unary(service, "PrefixLookup", pb.PrefixLookupRequest, service.prefix_lookup),
        "Delete": _unary(service, "Delete", pb.DeleteRequest, service.delete),
        "Stats": _unary(service, "Stats", pb.StatsRequest, service.stats),
        "Flush": _unary(service, "Flush", pb.FlushRequest, service.flush, parse=parse_canonical),
        "ListNamespaces": _unary(
            service, "ListNamespaces", pb.ListNamespacesRequest, service.list_namespaces
        ),
        "Inspect": _unary(service, "Inspect", pb.InspectRequest, service.inspect),
        "Successors": _unary(service, "Successors", pb.SuccessorsRequest, service.successors),
        "Hottest": _unary(service, "Hottest", pb.HottestRequest, service.hottest),
    }
    methods: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Put": grpc.stream_unary_rpc_method_handler(_put(service, budget), ident, ident),
        "BatchGet": grpc.unary_stream_rpc_method_handler(_batch_get(service), ident, ident),
        **{name: grpc.unary_unary_rpc_method_handler(fn, ident, ident) for name, fn in unary.items()},
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)


def _token(context: grpc.ServicerContext) -> bytes | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return bearer_token(value)
    return None


def _unary(
    service: VaultService,
    name: str,
    request_type: type[M],
    fn: Callable[[Principal, M], Message],
    *,
    parse: Callable[[type[M], bytes], M] = parse_message,
) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            with service.calls.scope(name, _token(context), context.peer()) as who:
                return fn(who, parse(request_type, request)).SerializeToString()
        except Abort as exc:
            _abort(context, exc)

    return handle


def _put(
    service: VaultService, budget: InflightBudget
) -> Callable[[Iterator[bytes], grpc.ServicerContext], bytes]:
    def handle(frames: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        try:
            with service.calls.scope("Put", _token(context), context.peer()) as who:
                held = _Held(budget, who.tenant)
                try:
                    return service.put(who, held.frames(frames)).SerializeToString()
                finally:
                    held.release()
        except Abort as exc:
            _abort(context, exc)
        except ConnectionAbortedError as exc:
            context.abort(grpc.StatusCode.CANCELLED, str(exc))

    return handle


class _Held:
    """The bytes of one Put's frames, held against the budget as gRPC hands them over (it has received each
    whole by then: the budget stops a stalled or endless sender at one frame past it)."""

    def __init__(self, budget: InflightBudget, tenant: str) -> None:
        self.budget = budget
        self.tenant = tenant
        self.held = 0

    def frames(self, frames: Iterator[bytes]) -> Iterator[bytes]:
        try:
            for frame in frames:
                self.budget.take(len(frame), self.tenant)
                self.held += len(frame)
                yield frame
        except grpc.RpcError as exc:
            # gRPC ended the call under us: the client cancelled, or a message was over the limit (the
            # client has its status already). The peer went away, as on a closed bulk connection.
            raise ConnectionAbortedError("the Put stream ended before its last frame") from exc

    def release(self) -> None:
        """Give every byte back."""
        held, self.held = self.held, 0
        if held:
            self.budget.give(held, self.tenant)


def _batch_get(service: VaultService) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
    def handle(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        try:
            with service.calls.scope("BatchGet", _token(context), context.peer()) as who:
                reply = service.batch_get(who, parse_message(pb.BatchGetRequest, request))
                try:
                    for parts in reply.frames():
                        data = b"".join(parts)
                        reply.release()  # gRPC may wait on the peer: never with a read transaction open
                        yield data
                finally:
                    service.finish_batch_get(reply)
        except Abort as exc:
            _abort(context, exc)

    return handle


def _abort(context: grpc.ServicerContext, exc: Abort) -> NoReturn:
    context.abort(GRPC_CODES[exc.status], exc.details)


def _identity(value: Any) -> Any:
    return value
