"""Both ends of a connection: the channel a caller opens and the server a service runs, on the options they share.

Client and server keepalive settings agree, so the server never answers pings with GOAWAY
("too_many_pings"), and idle streams survive long validation phases (or a synchronous pull that
waits minutes for a step). A server takes calls behind its `gate.Gate`, with as many workers as the
gate admits calls plus `REFUSAL_WORKERS` for the calls it refuses, and never shares its port. Both
ends use TLS where the job's settings name a certificate (`security.tls_here`), plain text otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures

import grpc

from ..errors import ConfigError
from .gate import Gate
from .security import tls_here

__all__ = ["CHANNEL_OPTIONS", "MAX_MESSAGE_BYTES", "REFUSAL_WORKERS", "SERVER_OPTIONS", "open_channel", "serve"]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # HTTP/2's initial 64 KiB stream window made a 256-rank gather (2 MB to rank 0, 64 KB from each
    # host leader) wait for window updates; with 8 MiB the uncached cycle took about 40% less time.
    ("grpc.http2.lookahead_bytes", 8 * 1024 * 1024),
]
SERVER_OPTIONS: list[tuple[str, int | str]] = CHANNEL_OPTIONS + [
    ("grpc.so_reuseport", 0),  # a second server on a port in use fails instead of sharing its calls
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
]
# Workers beyond the gate's limit: the refusals of calls without the secret (microseconds each) always
# find one, however many calls with the secret are being served.
REFUSAL_WORKERS = 8


def open_channel(address: str, extra_options: Sequence[tuple[str, int | str]] = ()) -> grpc.Channel:
    """A channel to `address` with the shared options (and the caller's own, after them); encrypted, the
    service's certificate checked, where the settings name TLS material.

    Raises:
        ConfigError: a TLS file that the settings name cannot be read.
    """
    options = CHANNEL_OPTIONS + list(extra_options)
    tls = tls_here()
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=tls.authority), options)


def serve(gate: Gate, handler: grpc.GenericRpcHandler, address: str, *, who: str,
          thread_name_prefix: str) -> tuple[grpc.Server, int]:
    """Start a server for `handler` behind `gate` on `address` (port 0: any free port); return it and its port.

    Raises:
        ConfigError: the port is in use or the address is not local: ``{who} cannot listen on {address}: ...``;
            or the settings name TLS material that cannot be read, or no key to serve with.
    """
    tls = tls_here()
    credentials = grpc.ssl_server_credentials([tls.server_credentials(who)]) if tls is not None else None
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=gate.limit + REFUSAL_WORKERS,
                                                    thread_name_prefix=thread_name_prefix),
                         interceptors=[gate], options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    try:
        port = (server.add_secure_port(address, credentials) if credentials is not None
                else server.add_insecure_port(address))
    except RuntimeError as exc:  # grpc raises where it once returned 0
        port, reason = 0, str(exc)
    else:
        reason = "the port is in use or the address is not local"
    if not port:
        raise ConfigError(f"{who} cannot listen on {address}: {reason}.")
    server.start()
    return server, port
