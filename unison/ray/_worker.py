"""The Ray actor that runs one rank: its environment, its executable object, and each call the driver sends it.

`BaseHorovodWorker` is Horovod's worker class under the same name and methods. What it adds is how
a call ends: `execute` (the path of ``run_remote``) lets an exception through to Ray as Horovod's
does, but first stops the other ranks of the unison job, as an uncaught exception does in a
process started by a launcher; `supervised` (the path of ``run``, ``execute`` and
``execute_single``) never raises, and returns an `Outcome` that names the rank, its host, the
exception and the user's line, so that the driver can name every rank that failed.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from .._contract import HOSTS_UPDATED_EXIT
from .._job.failure import abort_job
from .._job.summary import describe
from ..config import process_environment
from ..errors import HorovodInternalError, JobInterrupt
from . import _logger

__all__ = ["BaseHorovodWorker", "Outcome"]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one call on one worker ended: ``ok`` (with `value`), ``hosts_updated`` (an elastic rank
    stopped after its commit for a change of hosts) or ``failed`` (with `reason`, and the exception
    itself when it can travel). `cause` says whether a failed rank failed on its own account (its
    program raised, its process died) rather than because another rank did (unison's
    `HorovodInternalError` family, or the interrupt of a job another rank stopped)."""

    status: str
    value: Any = None
    reason: str = ""
    error: BaseException | None = None
    cause: bool = False


class BaseHorovodWorker:
    """One rank's process: a Ray actor made by the executor (Horovod's ``BaseHorovodWorker``).

    Example:
        >>> actor = ray.remote(BaseHorovodWorker).remote()                  # doctest: +SKIP
        >>> ray.get(actor.update_env_vars.remote({"TEST": 1}))              # doctest: +SKIP
    """

    executable: Any = None

    def __init__(self, world_rank: int = 0, world_size: int = 1) -> None:
        self.host = self.hostname()  # the name failures give: the machine's, or the elastic host it runs as
        self.update_env_vars({"HOROVOD_HOSTNAME": self.host, "HOROVOD_RANK": world_rank, "HOROVOD_SIZE": world_size})

    def hostname(self) -> str:
        """The name of the machine this worker runs on."""
        return socket.gethostname()

    def node_id(self) -> str:
        """The id of the Ray node this worker runs on."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def get_gpu_ids(self) -> list[int]:
        """The GPUs Ray gave this worker."""
        import ray

        return [int(gpu) for gpu in ray.get_gpu_ids()]

    def update_env_vars(self, env_vars: Mapping[str, object]) -> None:
        """Set `env_vars` in this worker's environment (values as strings)."""
        os.environ.update({str(name): str(value) for name, value in env_vars.items()})
        self.host = str(env_vars.get("HOROVOD_HOSTNAME", getattr(self, "host", "")))

    def env_vars(self) -> dict[str, str]:
        """This worker's environment."""
        return dict(os.environ)

    def address_and_port(self) -> tuple[str, int]:
        """This node's address as Ray knows it, and a TCP port free on it now (rank 0's store listens there)."""
        import ray

        address = ray.util.get_node_ip_address()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind(("", 0))
            return address, int(probe.getsockname()[1])

    def start_executable(self, executable_cls: type | None = None, executable_args: list[Any] | None = None,
                         executable_kwargs: dict[str, Any] | None = None) -> None:
        """Make the object the executor's ``execute`` functions receive: ``executable_cls(*args, **kwargs)``."""
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or []), **(executable_kwargs or {}))

    def execute(self, func: Callable[[Any], Any]) -> Any:
        """Return ``func(self.executable)``; an exception stops the other ranks of the job, then propagates."""
        try:
            return func(self.executable)
        except Exception as exc:
            abort_job(exc)
            raise

    def supervised(self, func: Callable[[Any], Any]) -> Outcome:
        """Run ``func(self.executable)`` and say how it ended, never raising (`Outcome`)."""
        return self._supervise(lambda: func(self.executable))

    def start_executable_supervised(self, executable_cls: type | None = None,
                                    executable_args: list[Any] | None = None,
                                    executable_kwargs: dict[str, Any] | None = None) -> Outcome:
        """`start_executable`, saying how it ended (its constructor often joins the job: ``hvd.init()``)."""
        return self._supervise(lambda: self.start_executable(executable_cls, executable_args, executable_kwargs))

    def _supervise(self, call: Callable[[], Any]) -> Outcome:
        try:
            return Outcome("ok", call())
        except SystemExit as exc:
            if exc.code == HOSTS_UPDATED_EXIT:  # an elastic rank committed and stopped for a host change
                return Outcome("hosts_updated")
            return self._failed(exc)
        except BaseException as exc:  # noqa: BLE001  (every way a call ends is reported to the driver)
            return self._failed(exc)

    def leave(self) -> None:
        """Leave the unison job in order (``shutdown()``, with the other ranks), if it runs here."""
        from .._job.runtime import is_initialized, shutdown

        if is_initialized():
            shutdown()

    def set_queue(self, queue: Any) -> None:
        """Send what `unison.ray.ray_logger.log` is given to `queue` (the driver's callbacks)."""
        _logger.configure(queue)

    def _failed(self, exc: BaseException) -> Outcome:
        env = process_environment()
        rank = int(env.get("RANK", "0"))
        reason = describe(exc, rank, self.host or self.hostname(), os.getpid())
        if isinstance(exc, Exception):
            abort_job(exc)  # the other ranks stop now, naming this one, instead of waiting for it
        cause = not isinstance(exc, (HorovodInternalError, JobInterrupt))
        return Outcome("failed", reason=reason, error=exc if _travels(exc) else None, cause=cause)


def _travels(exc: BaseException) -> bool:
    """Whether `exc` can be pickled back to the driver (a class with its own constructor may not)."""
    try:
        from ray import cloudpickle

        cloudpickle.loads(cloudpickle.dumps(exc))
    except Exception:  # noqa: BLE001  (any failure means: send the reason alone)
        return False
    return True
