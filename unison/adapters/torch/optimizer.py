"""`DistributedOptimizer`: wrap a torch optimizer so that gradients are averaged across ranks.

The wrapper is the user's optimizer instance itself under a dynamic subclass of its class (same class
name, same ``param_groups`` and ``state`` objects; nothing is rebuilt). Each parameter gets a
``register_post_accumulate_grad_hook`` (a tensor hook, so it also fires under ``torch.compile``) that
counts backward passes. At the last one of the window, a GPU gradient is submitted for an in-place
allreduce at once; the engine batches whatever is queued each cycle. A CPU gradient is held until
``step()``/``synchronize()`` and submitted there with the others, in one batch (``cpu_overlap`` /
``UNISON_CPU_OVERLAP`` submits it at once instead): on a CPU, reducing while backward() runs takes
cores from the computation, and one rank's blocking MPI calls wait for a peer whose engine thread is
descheduled behind that peer's computation. ``step()`` waits for every handle. A parameter whose hook
never fired on this rank is handled by ``missing_grads``: ``"zero"`` (default) allreduces zeros so the
other ranks never hang; ``"error"`` does the same, then raises an error naming the parameters.

`compression` decides what travels: a cast (none, fp16, bf16) is allreduced; a sparsifier (top-K,
threshold; `unison.compression`) sends (index, value) pairs by allgather and keeps the unsent rest as
error feedback; PowerSGD (`Compression.powersgd`) reduces all gradients together, as low-rank
factors, in two grouped allreduces at ``synchronize()``; `Compression.partial` reduces no gradient,
and after each ``step()`` averages one rotating slice of the parameters.

With ``op=Adasum`` (on more than one rank) no gradient is reduced: each rank takes the wrapped
optimizer's step on its own gradients, and the parameters then move by the Adasum of every rank's
change (one grouped allreduce of the deltas per step), as Horovod's Adasum optimizer does. Adasum
adapts the combination to how much the ranks' updates agree, so the learning rate is the one for a
single rank's batch.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, overload

import torch

from ..._job import submit as core
from ..._job.gradients import (
    Framework,
    GradientPolicy,
    allreduce_scaling,
    bucket_name,
    check_passes,
    gradient_group_name,
    gradient_policy,
    partial_name,
    self_reduced_scale,
    sparse_name,
    sparsified_name,
)
from ..._job.runtime import Job, job
from ...compression import Exchange, payload_bytes
from ...compression._exchange import lowrank_allreduce
from ...errors import GradientCountError, InvalidArgumentError, MissingGradientError, NotInitializedError
from ...ops import CollectiveKind, ReduceOp
from ...process_sets import ProcessSet, global_process_set
from . import collectives as c
from .compression import Compression

if TYPE_CHECKING:
    from torch.optim.optimizer import StateDict

__all__ = ["DistributedOptimizer"]

_MISSING_MODES = ("zero", "error")


class _DistributedOptimizer:
    """Methods mixed into the dynamic subclass; state lives in attributes prefixed ``_unison_``."""

    # -- setup -------------------------------------------------------------------------------------

    def _unison_setup(self, named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                      policy: GradientPolicy,
                      groups: list[list[torch.Tensor]], missing_grads: str, cpu_overlap: bool | None) -> None:
        self._unison_policy = policy
        self._compression = policy.compression
        self._unison_exchange = policy.exchange
        if self._unison_exchange is not Exchange.ALLREDUCE:
            groups = []  # sparsified and partial schemes handle each parameter on its own
        self._unison_op = policy.op
        self._unison_process_set = policy.process_set
        self._unison_sparse_as_dense = policy.sparse_as_dense
        self._unison_missing = missing_grads
        self._unison_scaling = allreduce_scaling(policy)
        backward_passes_per_step = policy.backward_passes_per_step
        self.backward_passes_per_step = backward_passes_per_step
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)  # type: ignore[attr-defined]
        self._unison_params = [p for g in self.param_groups for p in g["params"]  # type: ignore[attr-defined]
                               if p.requires_grad]
        self._unison_group_of: dict[torch.Tensor, int] = {}
        self._unison_groups = groups
        for index, members in enumerate(groups):
            for p in members:
                self._unison_group_of[p] = index
        self._unison_countdown: dict[torch.Tensor, int] = {}
        # in flight per parameter: (handle, compressor context, compressed tensor), a function that waits
        # (sparse, sparsified), or None (PowerSGD: reduced together); a context is Any, as in `Compressor`
        self._unison_handles: dict[
            torch.Tensor, tuple[int, Any, torch.Tensor] | Callable[[], torch.Tensor] | None] = {}
        self._unison_group_ready: dict[int, set[torch.Tensor]] = {}
        self._unison_group_handles: dict[int, tuple[int, list[torch.Tensor], list[Any]]] = {}
        self._should_synchronize = True
        self._synchronized = False
        self._unison_warned_step = False
        current = job()
        self._unison_cpu_overlap = current.settings.cpu_overlap if cpu_overlap is None else bool(cpu_overlap)
        self._unison_deferred: list[torch.Tensor] = []  # CPU parameters whose gradient waits for step()
        self._unison_stats = {"steps": 0, "allreduces": 0, "grouped_allreduces": 0, "missing_filled": 0,
                              "partial_windows": 0, "wait_seconds": 0.0, "dense_bytes": 0,
                              "payload_bytes": 0}
        self._unison_job: Job | None = None
        self._unison_bind(current)
        # As in Horovod, an elastic job hooks every parameter even at one rank: the job may grow while
        # this optimizer lives on (its worker keeps its process), and the hooks act once it has grown.
        self._unison_elastic = bool(current.settings.elastic_driver)
        self._unison_hooks = []
        if self._unison_enabled or self._unison_elastic:
            for p in self._unison_params:
                self._unison_countdown[p] = backward_passes_per_step
                self._unison_hooks.append(p.register_post_accumulate_grad_hook(self._unison_hook))

    def _unison_bind(self, current: Job) -> None:
        """Take the size and membership of `current` (the job), which an elastic job changes when it re-forms."""
        self._unison_job = current
        process_set = self._unison_process_set
        set_members = current.set_members(process_set.process_set_id or 0) or ()
        self._unison_enabled = current.size > 1 and current.rank in set_members
        self._unison_adasum = self._unison_op is ReduceOp.ADASUM and current.size > 1
        if self._unison_adasum:
            core.check_adasum(process_set.process_set_id or 0, set_members, [])

    def _unison_rebind(self) -> None:
        """In an elastic job that re-formed since this optimizer last looked: bind to the new job, and start
        a new accumulation window (what was in flight belonged to the job before)."""
        if not self._unison_elastic:
            return
        try:
            current = job()
        except NotInitializedError:
            return
        if current is not self._unison_job:
            self._unison_bind(current)
            self._unison_handles, self._unison_group_handles, self._unison_group_ready = {}, {}, {}
            self._unison_new_window()
            self._synchronized = False

    def statistics(self) -> dict[str, float]:
        """Counters: steps, allreduces and grouped allreduces launched, missing gradients filled,
        partial accumulation windows flushed, seconds spent waiting in synchronize(), and this
        rank's gradient bytes before (``dense_bytes``) and after (``payload_bytes``) compression."""
        return dict(self._unison_stats)

    # -- the hook ----------------------------------------------------------------------------------

    def _unison_hook(self, p: torch.Tensor) -> None:
        self._unison_rebind()
        if not self._unison_enabled:
            return  # an elastic job at one rank (hooked for when it grows): nothing to reduce
        count = self._unison_countdown.get(p)
        if count is None:
            # torch hands a hook's return value to the hooks registered after it on the parameter
            raise InvalidArgumentError(
                "DistributedOptimizer's gradient hook received a tensor that is not one of its parameters "
                f"(a {type(p).__name__} of shape {list(p.shape)}): a post-accumulate-grad hook registered "
                "on the parameter before it returned a value, and torch passes that value on to the next "
                "hook. Make such hooks return None."
            )
        if count <= 0:
            raise GradientCountError(
                "Gradients were computed more than backward_passes_per_step times before call to "
                f"step(). Parameter {self._parameter_names.get(p)!r} got gradient "
                f"{self.backward_passes_per_step + 1} times with backward_passes_per_step="
                f"{self.backward_passes_per_step}. Increase backward_passes_per_step to accumulate "
                "gradients across multiple batches, or call step() (or synchronize()) after every "
                f"{self.backward_passes_per_step} backward passes."
            )
        self._unison_countdown[p] = count - 1
        if count == 1:
            self._synchronized = False
            if p.device.type == "cpu" and not self._unison_cpu_overlap:
                self._unison_deferred.append(p)
            else:
                self._unison_launch(p)

    def _unison_launch(self, p: torch.Tensor) -> None:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if self._unison_exchange is Exchange.PARTIAL or self._unison_adasum:
            return  # the local gradient is applied as is; step() averages a slice of the parameters
        if self._unison_exchange is Exchange.ALLGATHER:
            self._unison_launch_sparsified(p)
            return
        if self._unison_exchange is Exchange.LOWRANK:
            self._unison_handles[p] = None  # reduced together with the others in _unison_wait
            return
        group = self._unison_group_of.get(p)
        if group is not None:
            ready = self._unison_group_ready.setdefault(group, set())
            ready.add(p)
            if len(ready) == len(self._unison_groups[group]):
                self._unison_launch_group(group)
            return
        name = self._parameter_names.get(p)
        grad = p.grad
        if grad.is_sparse:
            if not self._unison_sparse_as_dense:
                self._unison_handles[p] = c.sparse_allreduce_async(
                    grad, sparse_name(str(name)), self._unison_op, self._unison_process_set)
                self._unison_stats["allreduces"] += 1
                return
            grad = grad.to_dense()
        compressed, ctx = self._compression.compress(grad)
        self._unison_stats["dense_bytes"] += payload_bytes(grad)
        self._unison_stats["payload_bytes"] += payload_bytes(compressed)
        op, pre, post = self._unison_scaling
        handle = c.submit_tensors(CollectiveKind.ALLREDUCE, [compressed], name, self._unison_process_set,
                                  in_place=True, op=op, prescale=pre, postscale=post)
        self._unison_handles[p] = (handle, ctx, compressed)
        self._unison_stats["allreduces"] += 1

    def _unison_launch_group(self, group: int) -> None:
        members = self._unison_groups[group]
        grads = []
        for p in members:
            assert p.grad is not None
            grads.append(p.grad.to_dense() if p.grad.is_sparse else p.grad)
        pairs = [self._compression.compress(g) for g in grads]
        self._unison_stats["dense_bytes"] += sum(payload_bytes(g) for g in grads)
        self._unison_stats["payload_bytes"] += sum(payload_bytes(t) for t, _ in pairs)
        op, pre, post = self._unison_scaling
        handle = c.submit_tensors(CollectiveKind.ALLREDUCE, [t for t, _ in pairs], bucket_name(group),
                                  self._unison_process_set, grouped=True, in_place=True,
                                  op=op, prescale=pre, postscale=post)
        self._unison_group_handles[group] = (handle, [t for t, _ in pairs], [ctx for _, ctx in pairs])
        self._unison_stats["grouped_allreduces"] += 1

    def _unison_launch_sparsified(self, p: torch.Tensor) -> None:
        grad = p.grad
        assert grad is not None
        dense = grad.to_dense() if grad.is_sparse else grad
        name = str(self._parameter_names.get(p))
        array = dense.detach().cpu().numpy()
        payload, ctx = self._compression.compress(array, name)
        self._unison_stats["dense_bytes"] += array.nbytes
        self._unison_stats["payload_bytes"] += payload_bytes(payload)
        handle, _, _ = core.submit(CollectiveKind.ALLGATHER, list(payload), sparsified_name(name),
                                   self._unison_process_set, grouped=True)
        scale = self_reduced_scale(self._unison_policy, core.set_size(self._unison_process_set))
        compression, device = self._compression, dense.device

        def wait() -> torch.Tensor:
            summed = compression.decompress(tuple(core.synchronize(handle)), ctx)
            return torch.from_numpy(summed * summed.dtype.type(scale)).to(device)

        self._unison_handles[p] = wait
        self._unison_stats["allreduces"] += 1

    def _unison_lowrank(self, params: list[torch.Tensor]) -> None:
        """Reduce these parameters' gradients together with PowerSGD (two grouped allreduces)."""
        grads = []
        for p in params:
            assert p.grad is not None
            grads.append(p.grad.to_dense() if p.grad.is_sparse else p.grad)
        # NumPy has no bfloat16: such gradients are factored in float32 and cast back
        arrays = [(g.float() if g.dtype == torch.bfloat16 else g).detach().cpu().numpy() for g in grads]
        names = [str(self._parameter_names.get(p)) for p in params]
        before = self._compression.statistics()
        scale = self_reduced_scale(self._unison_policy, core.set_size(self._unison_process_set))
        # the parameters that arrived are in hook order, which may differ between ranks: sort by name
        order = sorted(range(len(params)), key=names.__getitem__)
        sorted_names = [names[i] for i in order]
        results = lowrank_allreduce(self._compression, [arrays[i] for i in order], sorted_names,
                                    gradient_group_name(sorted_names), self._unison_process_set, scale)
        after = self._compression.statistics()
        for key in ("dense_bytes", "payload_bytes"):
            self._unison_stats[key] += after[key] - before[key]
        for i, result in zip(order, results):
            _write_grad(params[i], torch.from_numpy(result).to(grads[i].device, grads[i].dtype))
        self._unison_stats["grouped_allreduces"] += 2

    def _unison_average_slice(self) -> None:
        """Average this step's slice of the parameters across the set (partial synchronization)."""
        params = self._unison_params
        plan = self._compression.next_plan([p.numel() for p in params])
        views = [params[i].data.view(-1)[start:stop] for i, start, stop in plan]
        self._compression.count(sum(payload_bytes(p.data) for p in params),
                                sum(payload_bytes(v) for v in views))
        self._unison_stats["dense_bytes"] += sum(payload_bytes(p.data) for p in params)
        self._unison_stats["payload_bytes"] += sum(payload_bytes(v) for v in views)
        if not views:
            return
        part = (self._compression.step - 1) % self._compression.parts
        handle = c.submit_tensors(CollectiveKind.ALLREDUCE, views, partial_name(part),
                                  self._unison_process_set, grouped=True, in_place=True,
                                  op=ReduceOp.AVERAGE)
        c.synchronize(handle)
        self._unison_stats["grouped_allreduces"] += 1

    # -- synchronize / step ------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Finish reducing every gradient of this step, writing the results into ``p.grad``.

        Parameters whose gradient never arrived on this rank are reduced as zeros (so no rank
        hangs); with ``missing_grads="error"`` an error naming them is raised afterwards.
        """
        self._unison_rebind()
        if not self._unison_enabled:
            self._synchronized = True
            return
        missing, partial = [], []
        deferred, self._unison_deferred = self._unison_deferred, []
        with job().engine.batch():  # one cycle negotiates and fuses them all
            for p in deferred:
                self._unison_launch(p)
            for p in self._unison_params:
                count = self._unison_countdown[p]
                if count == 0:
                    continue
                if count == self.backward_passes_per_step:
                    missing.append(p)
                else:
                    partial.append((p, count))
                self._unison_countdown[p] = 0
                self._unison_launch(p)
        if partial:
            self._unison_stats["partial_windows"] += 1
            first, count = partial[0]
            warnings.warn(
                f"step()/synchronize() ran after {self.backward_passes_per_step - count} of "
                f"backward_passes_per_step={self.backward_passes_per_step} backward passes (parameter "
                f"{self._parameter_names.get(first)!r}); reducing the partial accumulation window now. "
                "Call step() every backward_passes_per_step passes, or set_backward_passes_per_step() "
                "for a shorter final window.",
                stacklevel=3,
            )
        self._unison_stats["missing_filled"] += len(missing)
        started = time.perf_counter()
        try:
            self._unison_wait()
        finally:
            self._unison_stats["wait_seconds"] += time.perf_counter() - started
            self._unison_new_window()
        self._synchronized = True
        if missing and self._unison_missing == "error":
            names = sorted(str(self._parameter_names.get(p)) for p in missing)
            raise MissingGradientError(
                f"{len(names)} parameter(s) produced no gradient on rank {job().rank} before step(): "
                f"{', '.join(names)}. They were reduced as zeros so that no rank hangs. Make every rank "
                "use these parameters in its forward pass, set requires_grad=False on unused ones, or "
                "pass missing_grads='zero' to accept zeros."
            )

    def _unison_wait(self) -> None:
        handles, self._unison_handles = self._unison_handles, {}
        group_handles, self._unison_group_handles = self._unison_group_handles, {}
        self._unison_group_ready = {}
        lowrank = [p for p, launched in handles.items() if launched is None]
        if lowrank:
            self._unison_lowrank(lowrank)
        for p, launched in handles.items():
            if launched is None:
                continue
            if callable(launched):  # sparse or sparsified: a function that waits
                _write_grad(p, launched())
                continue
            handle, ctx, compressed = launched
            c.synchronize(handle)
            _write_grad(p, self._compression.decompress(compressed, ctx))
        for group, (handle, tensors, ctxs) in group_handles.items():
            c.synchronize(handle)
            for p, t, ctx in zip(self._unison_groups[group], tensors, ctxs):
                _write_grad(p, self._compression.decompress(t, ctx))

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside this block ``step()`` does not reduce (use after an explicit ``synchronize()``).

        Example:
            >>> opt.synchronize(); scaler.unscale_(opt); clip(...)       # doctest: +SKIP
            >>> with opt.skip_synchronize(): scaler.step(opt)             # doctest: +SKIP
        """
        if self._unison_adasum:
            raise InvalidArgumentError(
                "skip_synchronize() cannot be used with op=Adasum: its step() reduces the parameters' "
                "change after the local step, not the gradients. Drop the skip_synchronize() block."
            )
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Wait for this step's gradients (unless already synchronized), then take the wrapped
        optimizer's step. Unlike Horovod, a step() after synchronize() never reduces twice; outside
        ``skip_synchronize()`` it warns once per optimizer, with Horovod's words."""
        self._unison_rebind()
        if self._should_synchronize:
            if not self._synchronized:
                self.synchronize()
            elif not self._unison_warned_step:
                self._unison_warned_step = True
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). The gradients are not reduced again, but the code is not "
                    "portable: Horovod reduces them twice there. Call step() inside "
                    "`with optimizer.skip_synchronize():` after an explicit optimizer.synchronize().",
                    stacklevel=2,
                )
        self._synchronized = False
        self._unison_stats["steps"] += 1
        if self._unison_adasum:
            return self._unison_adasum_step(closure)
        result = super().step(closure)  # type: ignore[misc]
        if self._unison_exchange is Exchange.PARTIAL and self._unison_enabled:
            with torch.no_grad():
                self._unison_average_slice()
        return result

    def _unison_adasum_step(self, closure: Callable[[], float] | None) -> float | None:
        """Step locally, then move every parameter by the Adasum of the ranks' changes."""
        params = self._unison_params
        before = [p.detach().clone() for p in params]
        result = super().step(closure)  # type: ignore[misc]
        with torch.no_grad():
            deltas = [(p.detach() - old).contiguous() for p, old in zip(params, before)]
            pairs = [self._compression.compress(d) for d in deltas]
            self._unison_stats["dense_bytes"] += sum(payload_bytes(d) for d in deltas)
            self._unison_stats["payload_bytes"] += sum(payload_bytes(t) for t, _ in pairs)
            names = [str(self._parameter_names.get(p)) for p in params]
            handle = c.submit_tensors(CollectiveKind.ALLREDUCE, [t for t, _ in pairs],
                                      f"adasum.{gradient_group_name(names)}", self._unison_process_set,
                                      grouped=True, in_place=True, op=ReduceOp.ADASUM)
            self._unison_stats["grouped_allreduces"] += 1
            c.synchronize(handle)
            for p, old, (t, ctx) in zip(params, before, pairs):
                p.copy_(old + self._compression.decompress(t, ctx))
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients; refuses while reductions into them are in flight or due."""
        self._unison_rebind()
        if self._unison_handles or self._unison_group_handles or self._unison_deferred:
            raise GradientCountError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(). This is prohibited as it can cause a race condition: the "
                "gradients are being reduced in place. Call step() (or synchronize()) first."
            )
        self._unison_new_window()
        self._unison_group_ready = {}
        super().zero_grad(set_to_none=set_to_none)  # type: ignore[misc]

    def _unison_new_window(self) -> None:
        """Start a new accumulation window: every parameter awaits its passes again, none is due."""
        for p in self._unison_countdown:
            self._unison_countdown[p] = self.backward_passes_per_step
        self._unison_deferred = []

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated before each reduction."""
        check_passes(passes)
        self.backward_passes_per_step = passes
        self._unison_new_window()

    def load_state_dict(self, state_dict: StateDict) -> None:
        """Load the wrapped optimizer's state and reset the accumulation window."""
        super().load_state_dict(state_dict)  # type: ignore[misc]
        self._unison_new_window()
        self._synchronized = False


def _write_grad(p: torch.Tensor, result: torch.Tensor) -> None:
    """Put the reduced gradient in ``p.grad``, in the layout autograd gave it.

    A sparse gradient reduced dense (``sparse_as_dense``, a group, a compressor) goes back sparse,
    with the sparse dimensions it had, as Horovod does: optimizers such as ``torch.optim.SparseAdam``
    refuse dense gradients.
    """
    grad = p.grad
    if grad is not None and grad.is_sparse and not result.is_sparse:
        p.grad = result.to_sparse(grad.sparse_dim())
    elif grad is None or grad.is_sparse or grad.shape != result.shape:
        p.grad = result
    elif result is not grad:
        grad.copy_(result)


# param_groups are torch's `list[dict[str, Any]]`: a group's options have a type each
def _parameter_names(param_groups: list[dict[str, Any]],
                     named_parameters: Iterable[tuple[str, torch.Tensor]] | None) -> dict[torch.Tensor, str]:
    if named_parameters is not None:
        named = list(named_parameters)
    else:
        named = [(f"allreduce.noname.{i}.{j}", v)
                 for i, group in enumerate(param_groups) for j, v in enumerate(group["params"])]
    if any(not isinstance(p, tuple) for p in named):
        raise InvalidArgumentError(
            "named_parameters should be a sequence of tuples (name, parameter), usually produced by "
            "model.named_parameters()."
        )
    seen, dups = set(), []
    for name, _ in named:
        if name in seen and name not in dups:
            dups.append(name)
        seen.add(name)
    if dups:
        raise InvalidArgumentError(
            f"Parameter names in named_parameters must be unique. Found duplicates: {', '.join(dups)}"
        )
    all_ids = {id(v) for g in param_groups for v in g["params"]}
    unnamed = all_ids - {id(v) for _, v in named}
    if unnamed:
        raise InvalidArgumentError(
            "named_parameters was specified, but one or more model parameters were not named. Python "
            f"object ids: {', '.join(str(i) for i in sorted(unnamed))}"
        )
    return {v: k for k, v in sorted(named, key=lambda kv: kv[0])}


def _groups(param_groups: list[dict[str, Any]], num_groups: int,
            groups: int | list[list[torch.Tensor]] | None) -> list[list[torch.Tensor]]:
    if groups is not None:
        if isinstance(groups, list):
            for members in groups:
                if not isinstance(members, list) or not all(isinstance(p, torch.Tensor) for p in members):
                    raise InvalidArgumentError(
                        "groups should be a non-negative integer or a list of list of torch.Tensor."
                    )
            params = {id(p) for g in param_groups for p in g["params"]}
            return [[p for p in members if p.requires_grad and id(p) in params]
                    for members in groups if members]
        if not isinstance(groups, int) or groups < 0:
            raise InvalidArgumentError(
                "groups should be a non-negative integer or a list of list of torch.Tensor."
            )
        num_groups = groups
    if not num_groups:
        return []
    trainable = [p for g in param_groups for p in g["params"] if p.requires_grad]
    count = min(num_groups, len(trainable))
    size, extra = divmod(len(trainable), count) if count else (0, 0)
    out, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        out.append(trainable[start:end])
        start = end
    return out


class _Wrapped(_DistributedOptimizer, torch.optim.Optimizer):
    """What `DistributedOptimizer` returns, as type checkers see it: the optimizer plus
    ``synchronize()``, ``skip_synchronize()``, ``statistics()`` and the rest. Never instantiated: the
    result's real class is a subclass of the wrapped optimizer's own class."""


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: object = Compression.none,
                         backward_passes_per_step: int = 1, op: ReduceOp | None = ReduceOp.AVERAGE,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: int | list[list[torch.Tensor]] | None = None,
                         sparse_as_dense: bool = False, process_set: ProcessSet = global_process_set,
                         *, missing_grads: str = "zero", cpu_overlap: bool | None = None) -> _Wrapped:
    """Wrap `optimizer` so that ``step()`` uses gradients averaged across the ranks.

    Returns the same optimizer state under a dynamic subclass of its class (same class name).

    Args:
        optimizer: the torch optimizer instance to wrap (not rebuilt).
        named_parameters: ``model.named_parameters()``; names the reductions (same on every rank).
        compression: `Compression.none`, ``fp16`` or ``bf16`` (casts); an instance of
            ``Compression.topk(ratio)`` or ``Compression.threshold(value)`` (sparsified, with error
            feedback); or ``Compression.partial(fraction)`` (local steps, one rotating slice of the
            parameters averaged per step). Stateful schemes: one instance per optimizer.
        backward_passes_per_step: backward passes accumulated locally before each reduction.
        op: `Average` (default), `Sum`, or `Adasum` (each rank steps locally; the parameters move by
            the Adasum of the ranks' changes; 1, 2, 4, ... ranks, the global process set).
        gradient_predivide_factor: Average as prescale ``1/f``, postscale ``f/size``.
        num_groups, groups: reduce parameters in groups (an int, or explicit lists of parameters).
        sparse_as_dense: reduce sparse gradients as dense tensors instead of by allgather.
        process_set: the ranks that average their gradients.
        missing_grads: ``"zero"`` or ``"error"`` for parameters without a gradient at step().
        cpu_overlap: reduce each CPU gradient as soon as backward() produces it (True), or all of
            them together at step()/synchronize() (False). None (default): ``UNISON_CPU_OVERLAP``
            (off). Gradients on other devices are always submitted as soon as they are ready.

    Example:
        >>> opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # doctest: +SKIP
    """
    policy = gradient_policy(Framework.TORCH, op=op, compression=compression,
                             gradient_predivide_factor=gradient_predivide_factor,
                             sparse_as_dense=sparse_as_dense, process_set=process_set,
                             backward_passes_per_step=backward_passes_per_step)
    if missing_grads not in _MISSING_MODES:
        raise InvalidArgumentError(
            f"missing_grads must be one of {_MISSING_MODES}. Got missing_grads={missing_grads!r}."
        )
    if isinstance(optimizer, _DistributedOptimizer):
        raise InvalidArgumentError("This optimizer is already a DistributedOptimizer; wrap it only once.")
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": base.__module__})
    wrapped: _Wrapped = object.__new__(cls)
    state = dict(optimizer.__dict__)
    # An LR scheduler created on the unwrapped optimizer patched a bound `step` onto the instance;
    # copying it would bypass the reduction.
    state.pop("step", None)
    wrapped.__dict__.update(state)
    wrapped._unison_setup(named_parameters, policy, _groups(optimizer.param_groups, num_groups, groups),
                          missing_grads, cpu_overlap)
    return wrapped
