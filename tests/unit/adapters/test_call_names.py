"""Names of torch's unnamed collectives (`unison.adapters.torch.call_names`): the same on every rank for
the same history, independent of the call itself, recurring with the program's period."""

from __future__ import annotations

import pytest

from unison.adapters.torch.call_names import CallNames


def names_of(signatures: list[str], **kw: int) -> list[str]:
    names = CallNames(**kw)
    return [names.next(s) for s in signatures]


def test_calls_are_numbered_until_the_program_repeats() -> None:
    assert names_of(list("abcd")) == ["0", "1", "2", "3"]


@pytest.mark.parametrize("period", [1, 2, 3, 5, 7])
def test_a_repeating_program_gets_names_that_recur_with_the_same_signature(period: int) -> None:
    unit = [f"bucket{i}" for i in range(period)]
    signatures = unit * 60
    names = names_of(signatures, min_window=8)
    seen: dict[str, set[str]] = {}
    for name, signature in zip(names, signatures):
        seen.setdefault(name, set()).add(signature)
    recurring = [n for n in names if n.startswith("p")]
    assert len(recurring) >= len(signatures) - 2 * period  # locked after two periods
    assert all(len(s) == 1 for s in seen.values())  # a name always carries the same signature
    window = int(recurring[0][1:].split(".")[0])
    assert window % period == 0 and window >= 8  # a multiple of the period, at least the window


def test_the_name_of_a_call_does_not_depend_on_the_call() -> None:
    # two ranks with the same history name their next call alike, whatever each asks for there
    base = list("ab" * 40)
    rank0, rank1 = CallNames(), CallNames()
    for s in base:
        assert rank0.next(s) == rank1.next(s)
    assert rank0.next("allreduce[3]") == rank1.next("broadcast[4]")


def test_a_change_of_program_unlocks_and_locks_again() -> None:
    names = CallNames(min_window=4)
    first = [names.next(s) for s in "ab" * 10]
    assert first[-1].startswith("p")
    assert names.next("z").startswith("p")  # named before z is seen: still in the period
    assert names.next("z") == str(names.calls - 1)  # z broke the period: plain numbers again
    again = [names.next(s) for s in "xyz" * 10]
    assert again[-1].startswith("p") and int(again[-1][1:].split(".")[0]) % 3 == 0


def test_replacing_a_failed_call_makes_two_histories_agree_again() -> None:
    rank0, rank1 = CallNames(min_window=4), CallNames(min_window=4)
    for s in "ab" * 10:
        rank0.next(s)
        rank1.next(s)
    failed = rank0.calls
    rank0.next("allreduce[3]")
    rank1.next("allreduce[4]")
    rank0.replace(failed, ("failed", "x"))
    rank1.replace(failed, ("failed", "x"))
    assert [rank0.next(s) for s in "ab" * 10] == [rank1.next(s) for s in "ab" * 10]
    assert (rank0.period, rank0.window) == (rank1.period, rank1.window)


def test_signatures_that_never_recur_do_not_accumulate() -> None:
    names = CallNames(max_period=8)
    for i in range(1000):
        names.next(("shape", i))
    assert len(names._last) <= 4 * 8 + 1 and len(names._history) <= 16


class _Plain:
    """The naming rule written out plainly (every call hashed, the period checked afresh): what
    `CallNames` must name alike, whatever shortcuts it takes while a period holds."""

    def __init__(self, max_period: int, min_window: int) -> None:
        self.max_period, self.min_window = max_period, min_window
        self.history: list[object] = []
        self.period = self.window = 0

    def next(self, signature: object) -> str:
        call = len(self.history)
        name = f"p{self.window}.{call % self.window}" if self.period else str(call)
        self.history.append(signature)
        if self.period and self.history[call - self.period] == signature:
            return name
        self.period = 0
        earlier = [at for at in range(max(0, call - self.max_period), call) if self.history[at] == signature]
        if earlier:
            period = call - earlier[-1]
            if call + 1 >= 2 * period and all(self.history[call - i] == self.history[call - i - period]
                                              for i in range(period)):
                self.period = period
                self.window = period * -(-self.min_window // period)
        return name


@pytest.mark.parametrize("seed", range(6))
def test_names_match_the_plain_rule_through_changes_of_program(seed: int) -> None:
    import random

    draw = random.Random(seed)
    program: list[object] = []
    while len(program) < 3000:  # stretches of repeating units, broken by stray calls and new units
        unit = [("allreduce", draw.randrange(6)) for _ in range(draw.randint(1, 12))]
        program += unit * draw.randint(1, 30) + [("extra", draw.randrange(3))] * draw.randint(0, 2)
    names, plain = CallNames(max_period=16, min_window=8, prefix="g."), _Plain(16, 8)
    for signature in program:
        assert names.next(signature) == "g." + plain.next(signature)
