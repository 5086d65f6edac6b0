"""The messages of the negotiation protocol: requests, responses, and their wire encoding.

Messages are frozen dataclasses of plain values. On the wire they are compact JSON (never pickle), so
the same bytes can travel over MPI or gRPC and a peer can never make another rank execute code.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from ..dtypes import DType
from ..ops import CollectiveKind, Kind, ReduceOp, TextEnum

__all__ = [
    "Request",
    "Response",
    "ResponseKind",
    "TextEnum",
    "WireError",
    "decode_request_lists",
    "decode_requests",
    "decode_responses",
    "encode_requests",
    "encode_responses",
]


@dataclasses.dataclass(frozen=True)
class Request:
    """One rank's wish to take part in one collective, as sent to the coordinator.

    Attributes:
        name: the cross-rank key (ranks match requests by name).
        kind: the collective.
        rank: the global rank that submitted it.
        dtype: element type.
        shape: the local tensor's shape.
        reduce_op: for allreduce/reducescatter.
        root_rank: global root rank for broadcast, else -1.
        prescale: factor applied before the reduction.
        postscale: factor applied after it (Average's 1/size is not included).
        process_set_id: the process set the collective runs in.
        device: "cpu" or "cuda".
        group: name of the atomic group this request belongs to ("" if none).
        group_size: number of members of that group (0 if none).
        splits: alltoall's per-destination dim-0 counts (empty for an equal split).
        ranks: members of the set for add/remove_process_set.
        reason: on a SHUTDOWN request, why this rank is failing ("" for an orderly shutdown); a
            non-empty reason makes the coordinator abort the whole job with it.
        site: where in the program the call was made (``train.py:41 in step``, with its origin such
            as ``(DDP bucket 0)``), for messages only: never compared, "" where unknown. Read when the
            request is made afresh, so a recurring call's request keeps the place of its first call.
    """

    name: str
    kind: CollectiveKind
    rank: int
    dtype: DType = DType.UINT8
    shape: tuple[int, ...] = ()
    reduce_op: ReduceOp = ReduceOp.SUM
    root_rank: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    process_set_id: int = 0
    device: str = "cpu"
    group: str = ""
    group_size: int = 0
    splits: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()
    reason: str = ""
    site: str = ""


ResponseKind = Kind
"""The name responses use for `unison.ops.Kind`: the ten collectives, plus ``ERROR`` (fail some
tensors), ``ABORT`` and ``STALL`` (stop the job) and ``TUNE`` (apply the autotuner's next parameters
at the end of the cycle, see `unison.protocol.autotune`). One enum for requests and responses, so a
response runs the very kind its requests asked for; on the wire a kind is its string value."""


@dataclasses.dataclass(frozen=True)
class Response:
    """What every member rank executes, in the same order on every rank.

    A response names one or more tensors of one collective kind (several after fusion). ``sizes``
    carries per-rank data the executor needs: allgather's dim-0 per rank, alltoall's split matrix
    (row = sender), each in set-rank order.

    Attributes:
        kind: the `ResponseKind` (a plain string of one of its values is converted).
        names: tensor names, in execution order.
        dtype: element type.
        shapes: one shape per name (the common shape; allgather/alltoall: rank 0's).
        reduce_op, root_rank, prescale, postscale, process_set_id, device: as in `Request`.
        sizes: per-rank data in set-rank order: allgather's dim-0 sizes ``(d0, d1, ...)``, or
            alltoall's split matrix ``((row of rank 0), (row of rank 1), ...)``, wrapped in a 1-tuple;
            a TUNE response's parameters (`unison.protocol.autotune.tune_response`).
        message: the error text for "error"/"abort" responses; "trial" or "settled" for "tune".
        last_joined: the JOIN response's last joined rank; the process set id for add/remove.
        ranks: members of a process set being added.
    """

    kind: ResponseKind
    names: tuple[str, ...]
    dtype: DType = DType.UINT8
    shapes: tuple[tuple[int, ...], ...] = ()
    reduce_op: ReduceOp = ReduceOp.SUM
    root_rank: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    process_set_id: int = 0
    device: str = "cpu"
    # Any: one field of three shapes chosen by `kind` (allgather's counts, alltoall's split matrix,
    # TUNE's scalars); each reader knows its kind, where a union would need a cast at every reader.
    sizes: tuple[Any, ...] = ()
    message: str = ""
    last_joined: int = -1
    ranks: tuple[int, ...] = ()
    group: str = ""

    def __post_init__(self) -> None:
        if type(self.kind) is not Kind:
            object.__setattr__(self, "kind", _response_kind(self.kind))

    def post_factor(self, set_size: int) -> float:
        """The factor applied after the reduction: `postscale`, divided by the set size for Average.

        Example:
            >>> Response(ResponseKind.ALLREDUCE, ("g",), reduce_op=ReduceOp.AVERAGE, postscale=2.0).post_factor(4)
            0.5
        """
        if self.reduce_op is ReduceOp.AVERAGE:
            return self.postscale / set_size
        return self.postscale

    def num_bytes(self) -> int:
        """Total bytes of the tensors this response moves (local view)."""
        total = 0
        for shape in self.shapes:
            count = 1
            for dim in shape:
                count *= dim
            total += count
        return total * self.dtype.itemsize


def _request_kind(value: object) -> Kind:
    """The kind a request names: one of the ten collectives (`unison.ops.COLLECTIVE_KINDS`)."""
    try:
        kind = Kind(value)
    except ValueError:
        kind = None
    if kind is None or not kind.is_collective:
        raise ValueError(f"{value!r} is not a valid CollectiveKind")
    return kind


def _response_kind(value: object) -> Kind:
    """The kind a response names: any `Kind`, given as the member or its string value."""
    try:
        return Kind(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a valid ResponseKind") from None


_REQUEST_FIELDS = [f.name for f in dataclasses.fields(Request)]
_RESPONSE_FIELDS = [f.name for f in dataclasses.fields(Response)]
_REQUEST_WIRE_FIELDS = [name for name in _REQUEST_FIELDS if name != "rank"]
_REQUEST_DEFAULTS = Request("", CollectiveKind.BARRIER, 0)
_RESPONSE_DEFAULTS = Response(ResponseKind.ERROR, ())


def _compact(obj: object, defaults: object, fields: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in fields:
        value = getattr(obj, name)
        if value == getattr(defaults, name) and name not in ("name", "kind", "rank", "names"):
            continue
        if isinstance(value, (Kind, DType)):
            value = value.value
        elif isinstance(value, ReduceOp):
            value = int(value)
        out[name] = value
    return out


def _tuples(value: object) -> object:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def encode_requests(requests: Sequence[Request]) -> bytes:
    """Serialize one rank's request list to bytes (JSON). The rank is not sent: the gather's order
    says who sent what, and ranks asking for the same collectives send identical bytes."""
    body = [_compact(r, _REQUEST_DEFAULTS, _REQUEST_WIRE_FIELDS) for r in requests]
    return json.dumps(body, separators=(",", ":")).encode()


def decode_requests(data: bytes, rank: int) -> list[Request]:
    """Parse bytes made by `encode_requests` on `rank`."""
    out = []
    for item in json.loads(data):
        item["rank"] = rank
        item["kind"] = _request_kind(item["kind"])
        if "dtype" in item:
            item["dtype"] = DType(item["dtype"])
        if "reduce_op" in item:
            item["reduce_op"] = ReduceOp(item["reduce_op"])
        for key in ("shape", "splits", "ranks"):
            if key in item:
                item[key] = tuple(item[key])
        out.append(Request(**item))
    return out


class WireError(ValueError):
    """A peer's negotiation payload could not be read; names the rank that sent it."""


def decode_request_lists(parts: Sequence[bytes]) -> list[list[Request]]:
    """Parse every rank's payload (index = rank). Identical payloads, the common case, are parsed
    once and the ranks that sent them get the same list object, whose requests carry the first such
    rank: the coordinator takes each rank from the list's position, never from `Request.rank`.

    Raises:
        WireError: a payload is not a request list made by `encode_requests` (a peer of another
            version, corrupted memory, or a hostile sender); the message names the rank.
    """
    parsed: dict[bytes, list[Request]] = {}
    out: list[list[Request]] = []
    for rank, data in enumerate(parts):
        if not data:
            out.append([])
            continue
        requests = parsed.get(data)
        if requests is None:
            try:
                requests = parsed[data] = _checked(decode_requests(data, rank))
            except Exception as exc:  # noqa: BLE001 - any parse failure is the sender's, reported as such
                shown = bytes(data[:60])
                raise WireError(
                    f"rank {rank} sent a negotiation message that rank 0 cannot read "
                    f"({type(exc).__name__}: {exc}; {len(data)} bytes starting {shown!r}). Every rank "
                    "must run the same unison version; anything else writing to the job's control "
                    "channel is a fault."
                ) from exc
        out.append(requests)
    return out


_TEXT_FIELDS = ("name", "device", "group", "reason", "site")
_INT_TUPLE_FIELDS = ("shape", "splits", "ranks")


def _checked(requests: list[Request]) -> list[Request]:
    """Check the field types a decoded payload could get wrong (JSON carries any type)."""
    for request in requests:
        for field in _TEXT_FIELDS:
            if not isinstance(getattr(request, field), str):
                raise TypeError(f"field {field!r} of {request.name!r} is not a string")
        for field in _INT_TUPLE_FIELDS:
            value = getattr(request, field)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise TypeError(f"field {field!r} of {request.name!r} is not a list of integers")
        for field in ("root_rank", "process_set_id", "group_size"):
            value = getattr(request, field)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"field {field!r} of {request.name!r} is not an integer")
        for field in ("prescale", "postscale"):
            if not isinstance(getattr(request, field), (int, float)):
                raise TypeError(f"field {field!r} of {request.name!r} is not a number")
    return requests


def encode_responses(responses: Sequence[Response]) -> bytes:
    """Serialize a response list to bytes (JSON)."""
    body = [_compact(r, _RESPONSE_DEFAULTS, _RESPONSE_FIELDS) for r in responses]
    return json.dumps(body, separators=(",", ":")).encode()


def decode_responses(data: bytes) -> list[Response]:
    """Parse bytes made by `encode_responses`."""
    out = []
    for item in json.loads(data):
        if "dtype" in item:
            item["dtype"] = DType(item["dtype"])
        if "reduce_op" in item:
            item["reduce_op"] = ReduceOp(item["reduce_op"])
        for key in ("names", "shapes", "sizes", "ranks"):
            if key in item:
                item[key] = _tuples(item[key])
        out.append(Response(**item))
    return out
