"""`GrpcFrontEnd`: the gRPC front-end of one broker — a `grpc.aio` server on the process's one
event loop (uvloop), serving `MessagingServicer` on `grpcServerPort` (0: no gRPC endpoint)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from broker.grpc.forward import Forwarder
from broker.grpc.protocol import spb_grpc
from broker.grpc.renewal import InvisibilityRenewer
from broker.grpc.route import RouteResolver
from broker.grpc.servicer import GrpcMetrics, MessagingServicer
from broker.grpc.tls import channel_credentials, server_credentials
from broker.http.server import listen_host
from broker.service import BrokerServices

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 3.0
# A request carries at most a batch of messages: the HTTP produce body's bound, plus framing.
_REQUEST_OVERHEAD_BYTES = 1024 * 1024


def strict_decoding(handler: Any) -> Any:
    """`handler` receiving the raw request bytes and decoding them itself, so a request that does
    not decode gets INVALID_ARGUMENT naming the error (grpc's own handling of a failing
    deserializer answers UNKNOWN, which reads like a server fault)."""
    if handler is None or handler.request_deserializer is None:
        return handler
    parse = handler.request_deserializer

    async def decode(raw: bytes, context: Any) -> Any:
        try:
            return parse(raw)
        except DecodeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request does not decode: {exc}")

    if handler.unary_unary is not None:
        unary = handler.unary_unary

        async def unary_unary(raw: bytes, context: Any) -> Any:
            return await unary(await decode(raw, context), context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, None, handler.response_serializer)
    if handler.unary_stream is not None:
        streaming = handler.unary_stream

        async def unary_stream(raw: bytes, context: Any) -> AsyncIterator[Any]:
            out = streaming(await decode(raw, context), context)
            if inspect.isasyncgen(out):
                async for item in out:
                    yield item
            else:  # a method that only aborts (UNIMPLEMENTED)
                await out

        return grpc.unary_stream_rpc_method_handler(unary_stream, None, handler.response_serializer)
    if handler.stream_stream is not None:
        bidi = handler.stream_stream

        async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            async def decoded() -> AsyncIterator[Any]:
                async for raw in requests:
                    yield await decode(raw, context)

            async for item in bidi(decoded(), context):
                yield item

        return grpc.stream_stream_rpc_method_handler(stream_stream, None, handler.response_serializer)
    return handler


class StrictDecoding(grpc.GenericRpcHandler):
    """The generated service's handlers, each wrapped by `strict_decoding` once (a server
    interceptor would wrap them again on every call)."""

    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self.inner = inner
        self._wrapped: dict[str, Any] = {}

    def service(self, handler_call_details: Any) -> Any:
        method = handler_call_details.method
        handler = self._wrapped.get(method)
        if handler is None:
            handler = strict_decoding(self.inner.service(handler_call_details))
            if handler is not None:
                self._wrapped[method] = handler
        return handler


class _Registrations:
    """Stands in for the server while the generated code registers the servicer's handlers."""

    def __init__(self) -> None:
        self.handlers: tuple[Any, ...] = ()

    def add_generic_rpc_handlers(self, handlers: tuple[Any, ...]) -> None:
        self.handlers += tuple(handlers)


class GrpcFrontEnd:
    """Start/stop the gRPC server of one broker (a `broker.runtime.FrontEnd`)."""

    name = "gRPC"

    @classmethod
    def create(cls, services: BrokerServices) -> GrpcFrontEnd | None:
        """The front-end, or None when `grpcServerPort` is 0 (the runtime's factory)."""
        return cls(services) if services.state.config.grpc_server_port else None

    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        cfg = services.state.config
        self.config = cfg
        self.addr: str = cfg.grpc_addr
        self.renewer = InvisibilityRenewer(services.pop)
        self.routes = RouteResolver(services.state, self.addr)
        self.forwarder = Forwarder(
            services.state, self.routes.master_grpc_addr, channel_credentials(cfg.listener, cfg.tls_client)
        )
        self.servicer = MessagingServicer(
            services,
            self.routes,
            self.renewer,
            self.forwarder,
            GrpcMetrics(services.metrics.registry),
        )
        self.server: grpc.aio.Server | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        """Bind and serve; OSError when the port cannot be bound (never a silent shared port)."""
        cfg = self.config
        limit = max(8 * 1024 * 1024, cfg.max_message_size * 2 + _REQUEST_OVERHEAD_BYTES)
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", -1),
                # grpc sets SO_REUSEPORT by default: a second broker on the same port would share
                # it silently instead of failing to start.
                ("grpc.so_reuseport", 0),
                # The HTTP listener's bounds (listener.config) on this port too: a connection that
                # has not finished its HTTP/2 handshake in requestHeaderTimeoutMs is closed (grpc's
                # own default is 120 s), and at most maxConnections are open, so idle or slow
                # sockets cannot take the descriptors replication and the HTTP API need.
                ("grpc.server_handshake_timeout_ms", cfg.listener.request_header_timeout_ms),
                ("grpc.max_allowed_incoming_connections", cfg.listener.max_connections),
            ],
        )
        generated = _Registrations()
        spb_grpc.add_MessagingServiceServicer_to_server(self.servicer, generated)
        self.server.add_generic_rpc_handlers(tuple(StrictDecoding(h) for h in generated.handlers))
        host = listen_host(cfg.broker_ip1)
        tls = server_credentials(cfg.listener, f"{cfg.broker_name}-grpc")
        try:
            bind = f"{host}:{cfg.grpc_server_port}"
            port = self.server.add_secure_port(bind, tls) if tls else self.server.add_insecure_port(bind)
        except RuntimeError as exc:
            port = 0
            reason = str(exc)
        else:
            reason = "address in use or not available"
        if port != cfg.grpc_server_port:
            self.server = None
            raise OSError(f"cannot listen for gRPC on {host}:{cfg.grpc_server_port}: {reason}")
        await self.server.start()
        self.renewer.start()
        log.info("event=grpc_started broker=%s addr=%s tls=%s", cfg.broker_name, self.addr, tls is not None)

    def request_stop(self) -> None:
        """Stop accepting; calls in progress get GRACEFUL_SHUTDOWN_S to finish."""
        if self.server is not None and not self._stopped.is_set():
            asyncio.get_running_loop().create_task(self.stop(), name=f"grpc-stop-{self.config.broker_name}")

    async def wait(self) -> None:
        """Until the server has stopped."""
        await self._stopped.wait()

    async def stop(self) -> None:
        """Stop accepting, let calls finish (bounded), stop renewing."""
        server, self.server = self.server, None
        if server is not None:
            await server.stop(GRACEFUL_SHUTDOWN_S)
            log.info("event=grpc_stopped broker=%s", self.config.broker_name)
        await self.renewer.stop()
        await self.routes.close()
        await self.forwarder.close()
        self._stopped.set()
