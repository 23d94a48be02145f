"""Shared-token authentication for the vault, checked in constant time on every call.

Clients send ``authorization: Bearer <token>``. Health checks stay open so that load balancers and
``grpc_health_probe`` work without the secret; everything that touches data requires the token.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


class TokenAuthInterceptor(_Interceptor):
    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("an empty token would let everyone in")
        self._expected = f"Bearer {token}".encode()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        sent = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                sent = value.encode() if isinstance(value, str) else value
        if hmac.compare_digest(sent, self._expected):
            return handler
        log.info("refused unauthenticated call to %s", method)
        return _deny(handler)


def _deny(handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    def refuse(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")

    ident: Callable[[Any], Any] = _identity
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, ident, ident)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, ident, ident)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, ident, ident)
    return grpc.unary_unary_rpc_method_handler(refuse, ident, ident)


def _identity(value: Any) -> Any:
    return value
