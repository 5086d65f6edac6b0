"""Names for torch's unnamed collectives: one per call, from what came before it, recurring with the program.

A name must be the same on every rank for the same call and must not depend on the call itself: then
two ranks that issue different collectives at the same point of their programs ask under one name,
and unison's coordinator reports the mismatch. The plain choice, the call's sequence number, never
repeats, so unison's response cache (which turns a repeated name with the same attributes into a
one-message cycle) never hits. Training repeats: DDP issues the same buckets every step. So the names
follow the program's period: once the calls' signatures (kind, shapes, dtypes, op, root) have repeated
with period K over the last K calls, call p is named ``p<W>.<p mod W>``, with W the smallest multiple
of K of at least `MIN_WINDOW` calls, and each name recurs with the same attributes every W calls (W
keeps a name from recurring while its previous call may still be in flight). The period is found from the calls before p only, which are the
same on every rank until the first divergence, so the name of the call that diverges is still the
same on every rank. Pure: unit-tested without torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

__all__ = ["MAX_PERIOD", "MIN_WINDOW", "CallNames"]

MAX_PERIOD = 256  # calls per repeating unit followed (a model with more buckets per step misses the cache)
MIN_WINDOW = 16  # calls before a name recurs (at most MIN_WINDOW + MAX_PERIOD names: they fit the cache)


class CallNames:
    """The name of each next call of one group (`prefix` leads every name).

    Example:
        >>> names = CallNames(min_window=4)
        >>> [names.next(s) for s in "abab"]
        ['0', '1', '2', '3']
        >>> names.next("a"), names.next("b"), names.next("c"), names.next("a")
        ('p4.0', 'p4.1', 'p4.2', '7')
    """

    def __init__(self, max_period: int = MAX_PERIOD, min_window: int = MIN_WINDOW, prefix: str = "") -> None:
        self.max_period = max_period
        self.min_window = max(1, min_window)
        self.prefix = prefix
        self.calls = 0
        self.period = 0  # 0: none found yet
        self.window = 0  # the smallest multiple of the period of at least min_window calls
        self._history: deque[Hashable] = deque(maxlen=2 * max_period)  # the last signatures
        # signature -> the last call that had it; kept up only while no period holds (a call in the
        # period then costs no hashing of its signature), and rebuilt from the history when one breaks
        self._last: dict[Hashable, int] = {}
        self._names: dict[int, list[str]] = {}  # window -> the names of its calls

    def __repr__(self) -> str:
        return f"<CallNames calls={self.calls} period={self.period}>"

    def next(self, signature: Hashable) -> str:
        """The name of the next call (decided before `signature` is looked at), then record it."""
        window = self.window
        if self.period:
            names = self._names.get(window)
            if names is None:
                names = self._names[window] = [f"{self.prefix}p{window}.{i}" for i in range(window)]
            name = names[self.calls % window]
        else:
            name = f"{self.prefix}{self.calls}"
        self._record(signature)
        return name

    def replace(self, call: int, signature: Hashable) -> None:
        """Record call `call` as `signature` instead (if it is still followed) and find the period again.

        A call that failed on every rank with different attributes (a mismatch) had a different
        signature on each; replacing it with the same token everywhere makes the ranks' histories,
        and so the names that follow, agree again.
        """
        first = self.calls - len(self._history)
        if call < first or call >= self.calls:
            return
        history = list(self._history)
        history[call - first] = signature
        calls = self.calls
        self.calls, self.period, self.window, self._last = first, 0, 0, {}
        self._history.clear()
        for entry in history:
            self._record(entry)
        assert self.calls == calls

    def _at(self, call: int) -> Hashable:
        return self._history[call - (self.calls - len(self._history))]

    def _record(self, signature: Hashable) -> None:
        call = self.calls
        history = self._history
        period = self.period
        if period and call >= period:
            then = history[-period]
            if then is signature or then == signature:  # the period holds: no hashing, no lookups
                history.append(then)
                self.calls = call + 1
                return
            self.period = 0  # it broke: where each signature was last is read back from the history
            self._last = {entry: at for at, entry in enumerate(history, call - len(history))}
        history.append(signature)
        self.calls = call + 1
        previous = self._last.get(signature)
        self._last[signature] = call
        if len(self._last) > 4 * self.max_period:  # signatures that never recur (varying shapes)
            oldest = call - self.max_period
            self._last = {key: seen for key, seen in self._last.items() if seen >= oldest}
        if previous is None:
            return
        period = call - previous
        if period > self.max_period or call + 1 < 2 * period:
            return
        if all(self._at(call - i) == self._at(call - i - period) for i in range(period)):
            self.period = period
            self.window = period * -(-self.min_window // period)
