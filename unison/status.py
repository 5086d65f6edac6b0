"""Print a live status table of a running job: ``python -m unison.status HOST:PORT``.

Needs the job's ``UNISON_CONTROLLER=grpc`` service address (rank 0 logs it at INFO) and its secret in
``UNISON_SECRET`` or ``UNISON_SECRET_FILE``.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["format_status", "main"]


def format_status(reply: object) -> str:
    """Render a StatusReply as a table, one line per rank."""
    ranks = list(reply.ranks)  # type: ignore[attr-defined]
    lines = [f"job of {reply.size} ranks" + (f" - ABORTING: {reply.abort}" if reply.abort else "")]  # type: ignore[attr-defined]
    lines.append(f"{'rank':>4}  {'host':<16} {'pid':>7} {'cycles':>8} {'heartbeat':>10}  "
                 "waiting on / others wait for it on")
    for r in ranks:
        beat = "never" if r.seconds_since_heartbeat < 0 else f"{r.seconds_since_heartbeat:.1f} s ago"
        lines.append(f"{r.rank:>4}  {r.host[:16]:<16} {r.pid:>7} {r.cycles:>8} {beat:>10}  "
                     f"waiting: {_names(r.waiting)}")
        if r.others_wait_for:
            lines.append(f"{'':>50}others wait for it: {_names(r.others_wait_for)}")
    return "\n".join(lines)


def _names(names: object, limit: int = 6) -> str:
    items = list(names)  # type: ignore[call-overload]
    if not items:
        return "-"
    shown = ", ".join(items[:limit])
    return shown + (f", ... and {len(items) - limit} more" if len(items) > limit else "")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m unison.status``."""
    parser = argparse.ArgumentParser(prog="python -m unison.status", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="the coordinator service, host:port")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
    args = parser.parse_args(argv)
    import grpc

    from .config import load_settings
    from .errors import ConfigError
    from .rpc.endpoints import open_channel
    from .rpc.security import load_secret, tls_here, token_metadata
    from .rpc.stub import Stub
    from .service import coordinator_pb2 as pb
    from .service.methods import COORDINATOR

    try:
        secret = load_secret(load_settings())
    except ConfigError as exc:
        print(f"unison.status: {exc}", file=sys.stderr)
        return 2
    if secret is None:
        print("unison.status: set UNISON_SECRET or UNISON_SECRET_FILE to the job's secret.", file=sys.stderr)
        return 2
    try:
        channel = open_channel(args.address)  # the service's own message limits, keepalive and TLS
    except ConfigError as exc:
        print(f"unison.status: {exc}", file=sys.stderr)
        return 2
    with channel:
        try:
            reply = Stub(channel, COORDINATOR, token_metadata(secret)).call("Status", pb.StatusRequest(),
                                                                            timeout=args.timeout)
        except grpc.RpcError as exc:
            hint = ""
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                hint = (" (if the job sets UNISON_TLS_*, set the same here: a service with TLS refuses plain-text "
                        "clients)" if tls_here() is None else
                        " (TLS is set here: the service must use it too, with a certificate that "
                        "UNISON_TLS_CA_FILE, or UNISON_TLS_CERT_FILE, trusts)")
            print(f"unison.status: {args.address}: {exc.code().name}: {exc.details()}{hint}", file=sys.stderr)
            return 1
    print(format_status(reply))
    return 0


if __name__ == "__main__":
    sys.exit(main())
