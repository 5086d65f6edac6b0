"""A cycle's slow path: every rank's uncached requests gathered to rank 0, negotiated there, the answer broadcast.

It runs only in a cycle whose status says some rank has requests the cache could not answer, or rank 0
has news (a stall report that stops the job, the autotuner's next parameters). Rank 0's `Coordinator`
(`unison.protocol.negotiation`) decides; whatever goes wrong in that step becomes an abort response
that carries the cause, so every rank stops with it instead of waiting for a rank 0 whose engine died.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ..backends.base import Backend
from ..ops import Kind
from ..protocol.autotune import Proposal, split_tuning
from ..protocol.messages import (
    Response,
    WireError,
    decode_request_lists,
    decode_responses,
    encode_responses,
)
from ..protocol.negotiation import Coordinator
from .autotuning import Autotuning
from .observer import CycleObserver

__all__ = ["SlowPath"]

log = logging.getLogger(__name__)


class SlowPath:
    """This rank's part of the slow path (rank 0's includes the negotiation).

    Args:
        backend: the control plane.
        coordinator: rank 0's coordinator, None on every other rank.
        autotuning: the autotuner (rank 0 appends its due parameters to the responses).
        observer: the engine's current cycle observer (told of each negotiation).

    Attributes:
        news: rank 0: a stall report to broadcast as a job stop in the next slow-path cycle ("" if none).
    """

    def __init__(self, backend: Backend, coordinator: Coordinator | None, autotuning: Autotuning,
                 observer: Callable[[], CycleObserver]) -> None:
        self._backend, self._coordinator = backend, coordinator
        self._autotuning, self._observer = autotuning, observer
        self.news = ""

    def __repr__(self) -> str:
        return f"<SlowPath rank0={self._coordinator is not None} news={bool(self.news)}>"

    def run(self, payload: bytes, lengths: Sequence[int], now: float) -> tuple[list[Response], Proposal | None]:
        """Gather the request lists (`lengths`: every rank's payload length) to rank 0, which negotiates;
        broadcast its answer; return this cycle's responses and the autotuner's proposal, if any."""
        gathered = self._backend.gather_bytes(payload, lengths)
        data: bytes | None = None
        if self._coordinator is not None:
            assert gathered is not None
            data = encode_responses(self._negotiate(self._coordinator, gathered, now))
        return split_tuning(decode_responses(self._backend.broadcast_bytes(data)))

    def _negotiate(self, coordinator: Coordinator, gathered: list[bytes], now: float) -> list[Response]:
        """Rank 0: decide this cycle's responses from every rank's payload (an abort on any failure)."""
        try:
            lists = decode_request_lists(gathered)
            if self.news:
                responses = [Response(Kind.STALL, (), message=self.news)]
                self.news = ""
            else:
                responses = coordinator.handle(lists, now)
                tune = self._autotuning.take_due()
                if tune is not None:
                    responses = [*responses, tune]
            self._observer().negotiated(lists, responses)
        except WireError as exc:
            log.error("%s", exc)
            return coordinator.abort(f"unison stopped the job: {exc}")
        except Exception as exc:  # noqa: BLE001 - reaches every rank as the abort's reason
            log.exception("the coordinator failed")
            return coordinator.abort(
                f"unison stopped the job: its coordinator on rank 0 failed: {type(exc).__name__}: {exc}"
            )
        return responses
