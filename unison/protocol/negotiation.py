"""The rank-0 Coordinator: decides from gathered requests which collectives every rank runs, in what order.

Pure logic, no I/O: `Coordinator.handle` takes each rank's request list for one cycle and returns the
ordered response list that the engine broadcasts. It remembers requests across cycles (so ranks may
submit in different orders), validates that ranks agree on each collective before it runs, and turns
disagreement into an error response naming the ranks grouped by value, never a hang.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from ..ops import CollectiveKind
from .messages import Request, Response, ResponseKind
from .names import kind_conflict, split_name, unnamed_drift, unnamed_index
from .partition import split_counts

__all__ = ["Coordinator", "CoordinatorStatistics", "join_conflict", "reducescatter_rows", "sites_of"]

_WORLD_KINDS = frozenset(
    {CollectiveKind.ADD_PROCESS_SET, CollectiveKind.REMOVE_PROCESS_SET}
)
_NOT_WITH_JOIN = {
    CollectiveKind.ALLGATHER: "Allgather is not supported with Join at this time. "
    "Specify sparse_as_dense=True if using DistributedOptimizer.",
    CollectiveKind.ALLTOALL: "Alltoall is not supported with Join at this time.",
    CollectiveKind.BROADCAST: "Broadcast is not supported with Join at this time.",
    CollectiveKind.REDUCESCATTER: "Reducescatter is not supported with Join at this time.",
}
_DIM0_MAY_DIFFER = frozenset({CollectiveKind.ALLGATHER, CollectiveKind.ALLTOALL})
_NEEDS_DIMENSION = frozenset(
    {CollectiveKind.ALLGATHER, CollectiveKind.ALLTOALL, CollectiveKind.REDUCESCATTER}
)
_FIX_HINT = " Every rank must submit the same collective with the same attributes under one name."


def reducescatter_rows(dim0: int, size: int) -> list[int]:
    """Rows each set rank receives from a reducescatter: the first ``dim0 % size`` get one extra.

    Example:
        >>> reducescatter_rows(5, 3)
        [2, 2, 1]
    """
    return split_counts(dim0, size)


def join_conflict(kind: CollectiveKind, members: Iterable[int], joined: Iterable[int]) -> str:
    """Return why `kind` cannot run in a set of `members` while `joined` ranks have joined, or ''.

    A joined rank contributes zeros to reductions, but has nothing to gather, scatter or receive, so
    allgather, alltoall, broadcast and reducescatter fail (on the ranks that called them, once all of
    those did) while one of the set's members has joined. A joined rank outside the set is no part
    of the collective and does not count.

    Example:
        >>> join_conflict(CollectiveKind.BROADCAST, members=(0, 1, 2), joined={2})
        'Broadcast is not supported with Join at this time. Joined rank [2].'
        >>> join_conflict(CollectiveKind.BROADCAST, members=(0, 1), joined={2})
        ''
    """
    if kind not in _NOT_WITH_JOIN:
        return ""
    joined_members = set(joined).intersection(members)
    if not joined_members:
        return ""
    return f"{_NOT_WITH_JOIN[kind]} Joined {_fmt_ranks(joined_members)}."


def _fmt_ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {ranks}"


def _group_by_value(by_rank: Mapping[int, Request], value: Callable[[Request], str]) -> str:
    """Render 'A on ranks [0, 1]; B on rank [2]' with groups ordered by their lowest rank."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(by_rank):
        groups.setdefault(value(by_rank[rank]), []).append(rank)
    return "; ".join(f"{val} on {_fmt_ranks(ranks)}" for val, ranks in groups.items())


def _sites_text(sites: Mapping[int, str]) -> str:
    """' Called at A on rank [0]; B on ranks [1, 2].' from rank -> `Request.site`, '' when none is known.

    Example:
        >>> _sites_text({0: "t.py:5 in main", 1: "t.py:4 in main", 2: "t.py:5 in main"})
        ' Called at t.py:5 in main on ranks [0, 2]; t.py:4 in main on rank [1].'
    """
    groups: dict[str, list[int]] = {}
    for rank in sorted(sites):
        if sites[rank]:
            groups.setdefault(sites[rank], []).append(rank)
    if not groups:
        return ""
    return " Called at " + "; ".join(f"{site} on {_fmt_ranks(ranks)}" for site, ranks in groups.items()) + "."


_SITES_START = " Called at "
_SITE_GROUP = re.compile(r"(?P<site>.+?) on ranks? \[(?P<ranks>\d+(?:, \d+)*)\](?:; |\.(?=\s|$))")


def sites_of(message: str) -> dict[int, str]:
    """Each rank's call site in a message that `_sites_text` ended (rank -> site); {} when it names none.

    The message may be quoted inside a longer text (torch's autograd re-raises a DDP hook's error as text).

    Example:
        >>> sites_of("Mismatched x." + _sites_text({0: "t.py:5 in main", 1: "t.py:4 in main", 2: "t.py:5 in main"}))
        {0: 't.py:5 in main', 2: 't.py:5 in main', 1: 't.py:4 in main'}
    """
    start = message.rfind(_SITES_START)
    if start < 0:
        return {}
    sites: dict[int, str] = {}
    for group in _SITE_GROUP.finditer(message[start + len(_SITES_START):]):
        for rank in group["ranks"].split(", "):
            sites[int(rank)] = group["site"]
    return sites


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _factor_text(value: float) -> str:
    return f"{value:g}"


@dataclasses.dataclass(frozen=True)
class CoordinatorStatistics:
    """Counters of a `Coordinator`: cycles, requests, responses and error responses; names pending, ranks joined."""

    cycles: int
    requests: int
    responses: int
    errors: int
    pending: int
    joined: int


@dataclasses.dataclass
class _Pending:
    """Requests received so far for one name: rank -> its request, in arrival order. Ranks that sent
    identical request lists share one Request object (its own `rank` field is then one of them)."""

    requests: dict[int, Request]
    first_seen: float
    ready: bool = False
    # the distinct Request objects in `requests` (usually one): agreement is checked on these alone
    distinct: list[Request] = dataclasses.field(default_factory=list)
    # (process set, user name) and the unnamed call number: the keys of the cross-name checks
    family: tuple[int, str] = (0, "")
    unnamed: int | None = None


class Coordinator:
    """Negotiates collectives for one job; lives on global rank 0 and is fed plain data.

    Example:
        >>> from unison.dtypes import DType
        >>> c = Coordinator(size=2)
        >>> a = Request("x", CollectiveKind.ALLREDUCE, 0, DType.FLOAT32, (4,))
        >>> b = dataclasses.replace(a, rank=1)
        >>> [r.names for r in c.handle([[a], []], now=0.0)]
        []
        >>> [r.names for r in c.handle([[], [b]], now=0.1)]
        [('x',)]
    """

    def __init__(self, size: int, process_sets: Mapping[int, Sequence[int]] | None = None) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1. Got size={size}.")
        self.size = size
        self._sets: dict[int, tuple[int, ...]] = {0: tuple(range(size))}
        for set_id, ranks in (process_sets or {}).items():
            self._sets[set_id] = tuple(sorted(ranks))
        self._next_set_id = max(self._sets) + 1
        self._table: dict[str, _Pending] = {}
        self._joined: set[int] = set()
        self._last_joined = -1
        # expected ranks per process set given the joined ranks; cleared when either changes
        self._expected_cache: dict[int, frozenset[int]] = {}
        self._world = frozenset(range(size))
        self._groups: dict[str, set[str]] = {}
        # pending names by (process set, user name), and pending unnamed names by process set
        self._families: dict[tuple[int, str], set[str]] = {}
        self._unnamed: dict[int, set[str]] = {}
        self._stats = {"cycles": 0, "requests": 0, "responses": 0, "errors": 0}

    def __repr__(self) -> str:
        return (
            f"<Coordinator size={self.size} pending={len(self._table)} "
            f"joined={sorted(self._joined)} process_sets={sorted(self._sets)}>"
        )

    @property
    def process_sets(self) -> dict[int, tuple[int, ...]]:
        """Registered process sets: id -> sorted global ranks."""
        return dict(self._sets)

    def statistics(self) -> CoordinatorStatistics:
        """Counters: cycles handled, requests received, responses and error responses made."""
        return CoordinatorStatistics(**self._stats, pending=len(self._table), joined=len(self._joined))

    def pending(self) -> dict[str, tuple[frozenset[int], frozenset[int], float]]:
        """Names some ranks submitted and others not yet: name -> (submitted, expected, first seen)."""
        out = {}
        for name, entry in self._table.items():
            first = next(iter(entry.requests.values()))
            expected = self._expected(first)
            out[name] = (frozenset(entry.requests), frozenset(expected), entry.first_seen)
        return out

    def has_pending(self) -> bool:
        """Whether some name was submitted by some ranks and not run yet."""
        return bool(self._table)

    def sites(self) -> dict[str, str]:
        """Where in the program each pending name was called (`Request.site`, one of the ranks'), for
        the names whose requests carry one: name -> ``train.py:41 in step``."""
        out = {}
        for name, entry in self._table.items():
            site = next((request.site for request in entry.distinct if request.site), "")
            if site:
                out[name] = site
        return out

    def abort(self, message: str) -> list[Response]:
        """Return the response list that stops the job on every rank with `message`."""
        self._stats["responses"] += 1
        return [Response(ResponseKind.ABORT, (), message=message)]

    def handle(self, request_lists: Sequence[Sequence[Request]], now: float) -> list[Response]:
        """Take one cycle's request list from each global rank; return the responses, in order.

        Args:
            request_lists: index r holds what rank r sent this cycle (rank 0's own list first).
            now: a monotonic timestamp, used to remember when a name was first requested.

        Returns:
            Responses to execute on every rank in this order: ready collectives (ordered by when they
            became ready), error responses for those whose ranks disagreed, then a join response when
            every rank has joined, and a shutdown response if any rank asked to stop. A shutdown
            request with a reason (a rank failing) instead yields only an abort response carrying
            the lowest such rank's reason.
        """
        self._stats["cycles"] += 1
        out: list[Response] = []
        shutdown_ranks: list[int] = []
        # Ranks that sent the very same list object (identical payloads, decoded once) are handled
        # together: the work per cycle grows with ranks + requests, not ranks x requests.
        senders: dict[int, tuple[Sequence[Request], list[int]]] = {}
        for rank, requests in enumerate(request_lists):
            if requests:
                senders.setdefault(id(requests), (requests, []))[1].append(rank)
        failures = [(ranks[0], r) for requests, ranks in senders.values() for r in requests
                    if r.kind is CollectiveKind.SHUTDOWN and r.reason]
        if failures:
            self._stats["requests"] += sum(len(requests) for requests in request_lists)
            return self.abort(min(failures, key=lambda pair: pair[0])[1].reason)
        joined_now: list[int] = []
        for requests, ranks in senders.values():
            self._stats["requests"] += len(requests) * len(ranks)
            for request in requests:
                if request.kind is CollectiveKind.SHUTDOWN:
                    shutdown_ranks.extend(ranks)
                elif request.kind is CollectiveKind.JOIN:
                    self._joined.update(ranks)
                    self._expected_cache.clear()
                    joined_now.extend(ranks)
                else:
                    self._add(request, ranks, now, out)
        if joined_now:
            self._last_joined = max(joined_now)
        if self._joined:
            # Joining can complete tensors that were only waiting for the joined ranks.
            for name, entry in list(self._table.items()):
                if not entry.ready and self._is_ready(entry):
                    self._mark_ready(name, entry, out)
        if len(self._joined) == self.size:
            out.append(Response(ResponseKind.JOIN, ("join",), last_joined=self._last_joined))
            self._joined.clear()
            self._expected_cache.clear()
        if shutdown_ranks:
            out.append(
                Response(ResponseKind.SHUTDOWN, (), ranks=tuple(sorted(set(shutdown_ranks))))
            )
        self._stats["responses"] += len(out)
        return out

    # -- bookkeeping -------------------------------------------------------------------------------

    def _expected(self, request: Request) -> frozenset[int]:
        """The ranks whose request `request`'s collective waits for (its set, less joined ranks)."""
        if request.kind in _WORLD_KINDS:
            return self._world
        expected = self._expected_cache.get(request.process_set_id)
        if expected is None:
            members = self._sets.get(request.process_set_id, ())
            expected = frozenset(members).difference(self._joined)
            self._expected_cache[request.process_set_id] = expected
        return expected

    def _is_ready(self, entry: _Pending) -> bool:
        first = next(iter(entry.requests.values()))
        expected = self._expected(first)
        if not expected or len(entry.requests) < len(expected):
            return False  # the common case while ranks arrive: no O(size) scan per request
        return entry.requests.keys() >= expected

    def _add(self, request: Request, ranks: Sequence[int], now: float, out: list[Response]) -> None:
        """Record `request` as sent by each of `ranks`."""
        entry = self._table.get(request.name)
        if entry is None:
            entry = self._table[request.name] = self._new_entry(request, now)
        if entry.requests and not entry.requests.keys().isdisjoint(ranks):
            again = sorted(entry.requests.keys() & set(ranks))
            who = f"Rank {again[0]}" if len(again) == 1 else f"Ranks {again}"
            out.append(self._error(
                (request.name,),
                f"{who} submitted {request.kind.value} '{request.name}' twice before it completed. "
                "Use a different name for each tensor in flight.",
            ))
            ranks = [r for r in ranks if r not in entry.requests]
            if not ranks:
                return
        entry.requests.update(dict.fromkeys(ranks, request))
        if not any(request is seen for seen in entry.distinct):
            entry.distinct.append(request)
        if self._is_ready(entry):
            self._mark_ready(request.name, entry, out)
        elif len(self._families.get(entry.family, ())) > 1 or (
            entry.unnamed is not None and len(self._unnamed[entry.family[0]]) > 1
        ):
            self._check_across_names(entry, out)

    def _new_entry(self, request: Request, now: float) -> _Pending:
        _, rest = split_name(request.name)
        family = (request.process_set_id, rest)
        entry = _Pending({}, now, family=family, unnamed=unnamed_index(rest))
        if rest:  # names made by unison are '<kind>.<name>'; others (tests, tools) have no family
            self._families.setdefault(family, set()).add(request.name)
        if entry.unnamed is not None:
            self._unnamed.setdefault(request.process_set_id, set()).add(request.name)
        return entry

    def _remove(self, name: str) -> _Pending:
        """Take `name` out of the table and out of the cross-name indexes."""
        entry = self._table.pop(name)
        family = self._families.get(entry.family)
        if family is not None:
            family.discard(name)
            if not family:
                del self._families[entry.family]
        if entry.unnamed is not None:
            unnamed = self._unnamed.get(entry.family[0])
            if unnamed is not None:
                unnamed.discard(name)
                if not unnamed:
                    del self._unnamed[entry.family[0]]
        return entry

    def _check_across_names(self, entry: _Pending, out: list[Response]) -> None:
        """Fail, at once, pending collectives that can never run: one user name asked for under two
        kinds, or unnamed calls whose ranks are out of step (see `unison.protocol.names`)."""
        set_id, rest = entry.family
        names = sorted(self._families.get(entry.family, ()))
        problem = ""
        if len(names) > 1:
            first = next(iter(entry.requests.values()))
            submitted = {split_name(n)[0]: frozenset(self._table[n].requests) for n in names}
            problem = kind_conflict(rest, submitted, self._expected(first))
        if not problem and entry.unnamed is not None:
            names = sorted(self._unnamed.get(set_id, ()))
            pending = []
            for name in names:
                other = self._table[name]
                assert other.unnamed is not None
                pending.append((other.unnamed, split_name(name)[0], frozenset(other.requests)))
            problem = unnamed_drift(pending, set_id)
        if not problem:
            return
        called: dict[int, str] = {}
        for name in names:  # in name order: a rank's latest call wins
            called.update((rank, request.site) for rank, request in self._table[name].requests.items())
        problem += _sites_text(called)
        for name in names:
            failed = self._remove(name)
            first = next(iter(failed.requests.values()))
            if first.group in self._groups:
                self._groups[first.group].discard(name)
            out.append(self._error((name,), problem))

    def _mark_ready(self, name: str, entry: _Pending, out: list[Response]) -> None:
        entry.ready = True
        first = next(iter(entry.requests.values()))
        if not first.group:
            self._remove(name)
            out.append(self._respond(name, entry))
            return
        members = self._groups.setdefault(first.group, set())
        members.add(name)
        if len(members) < first.group_size:
            return
        # The whole group is ready: respond for all its members together, in name order.
        del self._groups[first.group]
        for member in sorted(members, key=_group_index):
            out.append(self._respond(member, self._remove(member)))

    def _error(self, names: tuple[str, ...], message: str) -> Response:
        self._stats["errors"] += 1
        return Response(ResponseKind.ERROR, names, message=message)

    # -- agreement checks --------------------------------------------------------------------------

    def _respond(self, name: str, entry: _Pending) -> Response:
        """Check that every rank agrees on `name`; return its response or an error response."""
        by_rank = entry.requests
        first = by_rank[min(by_rank)]
        kind = first.kind
        problem = self._disagreement(name, by_rank, first, entry.distinct)
        if problem:
            return self._error((name,), problem + _FIX_HINT + _sites_text({r: q.site for r, q in by_rank.items()}))
        conflict = join_conflict(kind, self._sets.get(first.process_set_id, ()), self._joined)
        if conflict:
            return self._error((name,), conflict)
        if kind is CollectiveKind.ADD_PROCESS_SET:
            return self._add_process_set(name, first)
        if kind is CollectiveKind.REMOVE_PROCESS_SET:
            self._sets.pop(first.process_set_id, None)
            self._expected_cache.clear()
            return Response(ResponseKind(kind.value), (name,), process_set_id=first.process_set_id)
        members = self._sets[first.process_set_id]
        sizes: tuple[tuple[int, ...] | tuple[tuple[int, ...], ...], ...] = ()
        if kind is CollectiveKind.ALLGATHER:
            sizes = (tuple(by_rank[r].shape[0] if r in by_rank else 0 for r in members),)
        elif kind is CollectiveKind.ALLTOALL:
            sizes = (tuple(_splits_of(by_rank[r], len(members)) for r in members),)
        return Response(
            ResponseKind(kind.value), (name,), first.dtype, (first.shape,), first.reduce_op, first.root_rank,
            first.prescale, first.postscale, first.process_set_id, first.device, sizes,
            group=first.group,
        )

    def _disagreement(self, name: str, by_rank: dict[int, Request], first: Request,
                      distinct: Sequence[Request]) -> str:
        """'' if every rank agrees on `name`, else the error text. `first` is the lowest rank's request,
        `distinct` the distinct Request objects in `by_rank`."""
        kind = first.kind
        if kind is not CollectiveKind.ALLTOALL and (first.shape or kind not in _NEEDS_DIMENSION):
            # The common case: every rank asked for exactly the same thing, usually as the very same
            # object (ranks whose request lists were identical share their requests), so only the
            # distinct objects are compared, not one request per rank.
            agreed = _agreement_key(first)
            if all(r is first or _agreement_key(r) == agreed for r in distinct):
                return ""
        ranks = sorted(by_rank)
        requests = [by_rank[r] for r in ranks]

        def differs(value: Callable[[Request], object]) -> bool:
            return any(value(r) != value(first) for r in requests[1:])

        label = f"{kind.value} '{name}'"
        if differs(lambda r: r.kind):
            return f"Mismatched operations for '{name}': " + _group_by_value(
                by_rank, lambda r: r.kind.upper
            ) + "."
        if differs(lambda r: r.process_set_id):
            return f"Mismatched process sets for {label}: " + _group_by_value(
                by_rank, lambda r: f"process set {r.process_set_id}"
            ) + "."
        if kind in _WORLD_KINDS:
            if differs(lambda r: r.ranks):
                return f"Mismatched process set ranks for {label}: " + _group_by_value(
                    by_rank, lambda r: str(list(r.ranks))
                ) + "."
            return ""
        if kind in (CollectiveKind.BARRIER,):
            return ""
        if differs(lambda r: r.dtype):
            return f"Mismatched data types for {label}: " + _group_by_value(
                by_rank, lambda r: r.dtype.value
            ) + "."
        if kind in _NEEDS_DIMENSION:
            scalars = [rank for rank in ranks if not by_rank[rank].shape]
            if scalars:
                return (
                    f"{kind.upper} of '{name}' needs a tensor with at least one dimension; "
                    f"{_fmt_ranks(scalars)} sent a scalar (shape [])."
                )
        if kind in _DIM0_MAY_DIFFER:
            if differs(lambda r: len(r.shape)):
                return f"Mismatched {kind.upper} tensor shapes for '{name}': " + _group_by_value(
                    by_rank, lambda r: f"a tensor of rank {len(r.shape)} {_shape_text(r.shape)}"
                ) + "."
            if differs(lambda r: r.shape[1:]):
                return (
                    f"Mismatched {kind.upper} tensor shapes for '{name}': dimensions after the first "
                    "must match: " + _group_by_value(
                        by_rank, lambda r: "[?" + "".join(f", {d}" for d in r.shape[1:]) + "]"
                    ) + "."
                )
        elif differs(lambda r: r.shape):
            return f"Mismatched {kind.upper} tensor shapes for '{name}': " + _group_by_value(
                by_rank, lambda r: _shape_text(r.shape)
            ) + "."
        if differs(lambda r: (r.prescale, r.postscale)):
            return f"Mismatched prescale and/or postscale factors for {label}: " + _group_by_value(
                by_rank, lambda r: f"({_factor_text(r.prescale)}, {_factor_text(r.postscale)})"
            ) + "."
        if kind in (CollectiveKind.ALLREDUCE, CollectiveKind.REDUCESCATTER) and differs(
            lambda r: r.reduce_op
        ):
            return f"Mismatched reduction operation for {label}: " + _group_by_value(
                by_rank, lambda r: r.reduce_op.name
            ) + "."
        if kind is CollectiveKind.BROADCAST and differs(lambda r: r.root_rank):
            return f"Mismatched BROADCAST root ranks for '{name}': " + _group_by_value(
                by_rank, lambda r: f"root rank {r.root_rank}"
            ) + "."
        if differs(lambda r: r.device):
            return f"Mismatched {kind.upper} CPU/GPU device selection for '{name}': " + _group_by_value(
                by_rank, lambda r: "GPU" if r.device != "cpu" else "CPU"
            ) + "."
        if differs(lambda r: (r.group, r.group_size)):
            return f"Mismatched groups for {label}: " + _group_by_value(
                by_rank, lambda r: f"group '{r.group}' of {r.group_size}"
            ) + "."
        if kind is CollectiveKind.ALLTOALL:
            members = self._sets[first.process_set_id]
            for rank in ranks:
                splits = _splits_of(by_rank[rank], len(members))
                rows = by_rank[rank].shape[0]
                if sum(splits) != rows:
                    return (
                        f"alltoall '{name}': splits on rank {rank} sum to {sum(splits)} but its "
                        f"tensor has {rows} rows; the splits must cover the first dimension."
                    )
        return ""

    def _add_process_set(self, name: str, first: Request) -> Response:
        ranks = tuple(sorted(first.ranks))
        for set_id, existing in self._sets.items():
            if existing == ranks:
                return self._error(
                    (name,),
                    f"Attempted to add a duplicate process set: ranks {list(ranks)} are already "
                    f"registered as process set {set_id}.",
                )
        bad = [r for r in ranks if not 0 <= r < self.size]
        if bad or not ranks:
            return self._error(
                (name,), f"A process set needs ranks in range(size={self.size}). Got {list(ranks)}."
            )
        set_id = self._next_set_id
        self._next_set_id += 1
        self._sets[set_id] = ranks
        self._expected_cache.clear()
        return Response(ResponseKind.ADD_PROCESS_SET, (name,), process_set_id=set_id,
                        ranks=ranks)


def _agreement_key(r: Request) -> tuple[object, ...]:
    """Every field the agreement checks compare (all but the rank); equal keys cannot disagree."""
    return (r.kind, r.process_set_id, r.ranks, r.dtype, r.shape, r.reduce_op, r.root_rank, r.prescale,
            r.postscale, r.device, r.group, r.group_size)


def _group_index(name: str) -> tuple[int, str]:
    """Sort key for grouped member names ending in '_<i>of<N>'."""
    head, _, tail = name.rpartition("_")
    index, _, _ = tail.partition("of")
    return (int(index), head) if index.isdigit() else (0, name)


def _splits_of(request: Request, set_size: int) -> tuple[int, ...]:
    if request.splits:
        return tuple(request.splits)
    dim0 = request.shape[0] if request.shape else 0
    return tuple([dim0 // set_size] * set_size)

