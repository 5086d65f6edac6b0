"""The exception tree of unison: every error it raises derives from `UnisonError`.

    UnisonError
    ├── NotInitializedError          (ValueError)      an API call before init() or after shutdown()
    ├── InvalidArgumentError         (ValueError)      a bad argument caught before anything is sent
    │   ├── UnsupportedDtypeError                      a dtype the operation cannot carry
    │   ├── DuplicateNameError                         a name already in flight on this rank
    │   ├── UnnamedThreadError                         an unnamed collective from a second thread
    │   └── RequestError                               a parameter server refused a request
    │       ├── TableFullError                         a table's shard has no room for new ids
    │       ├── NotDeclaredError                       it names a block or table the server does not hold
    │       └── ConflictError                          it disagrees with what the server holds
    ├── ConfigError                  (ValueError)      a bad keyword argument or UNISON_*/HOROVOD_* variable
    ├── MissingDependencyError       (ImportError)     an optional dependency is not installed
    ├── UnisonNotImplementedError    (NotImplementedError)
    ├── GradientCountError           (AssertionError)  gradients produced or cleared at the wrong moment
    ├── LaunchError                  (RuntimeError)    unisonrun/unison.run could not start or finish a job
    │   └── PlacementGroupTimeoutError (TimeoutError)  Ray could not reserve the workers in time (unison.ray)
    ├── StartupError                 (RuntimeError)    init() failed: a rank did not arrive or could not set up
    ├── ServerUnavailableError       (RuntimeError)    a parameter server did not answer in time
    ├── HostsUpdatedInterrupt        (RuntimeError)    an elastic job's hosts changed: it stops at this commit
    └── HorovodInternalError         (RuntimeError)    a collective failed; the Horovod-compatible base
        ├── MismatchError                              ranks disagreed on a collective's attributes
        ├── MissingGradientError                       parameters produced no gradient on some rank
        ├── ShutdownError                              the job was shut down while the op was pending
        │   └── StallError                             the stall inspector shut the job down
        ├── AbortedError                               another rank failed and the job is stopping
        └── TrainerLostError                           a synchronous parameter-server step lost a trainer
"""

from __future__ import annotations

__all__ = [
    "AbortedError",
    "ConfigError",
    "ConflictError",
    "DuplicateNameError",
    "GradientCountError",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "InvalidArgumentError",
    "JobInterrupt",
    "LaunchError",
    "MismatchError",
    "MissingDependencyError",
    "MissingGradientError",
    "NotDeclaredError",
    "NotInitializedError",
    "PlacementGroupTimeoutError",
    "RequestError",
    "ServerUnavailableError",
    "ShutdownError",
    "StallError",
    "StartupError",
    "TableFullError",
    "TrainerLostError",
    "UnisonError",
    "UnisonNotImplementedError",
    "UnnamedThreadError",
    "UnsupportedDtypeError",
]


class UnisonError(Exception):
    """Base class of every error unison raises."""


class NotInitializedError(UnisonError, ValueError):
    """An API call that needs a running job was made before `init()` or after `shutdown()`."""

    def __init__(self, message: str = "unison has not been initialized; use hvd.init().") -> None:
        super().__init__(message)


class InvalidArgumentError(UnisonError, ValueError):
    """An argument was refused on the calling rank before anything was sent."""


class UnsupportedDtypeError(InvalidArgumentError):
    """A tensor's dtype cannot be carried by the requested operation."""


class DuplicateNameError(InvalidArgumentError):
    """A collective was submitted under a name that is still in flight on this rank."""


class UnnamedThreadError(InvalidArgumentError):
    """An unnamed collective was submitted from a second thread; its pairing across ranks would be
    a race, so it needs a name."""


class ConfigError(UnisonError, ValueError):
    """A setting (keyword argument or environment variable) has an invalid value."""


class MissingDependencyError(UnisonError, ImportError):
    """An optional dependency needed by the requested feature is not installed."""


class UnisonNotImplementedError(UnisonError, NotImplementedError):
    """A Horovod feature that unison does not implement yet."""


class LaunchError(UnisonError, RuntimeError):
    """A job started by `unisonrun` or `unison.run` could not start, or ended without a result."""


class PlacementGroupTimeoutError(LaunchError, TimeoutError):
    """Ray could not reserve the workers' resources within ``placement_group_timeout_s`` (`unison.ray`)."""


class StartupError(UnisonError, RuntimeError):
    """`init()` failed on some rank: it did not arrive in time, or its local set-up raised.

    Attributes:
        missing_ranks: the ranks that did not arrive in time (empty when all arrived).
    """

    def __init__(self, message: str, missing_ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.missing_ranks = missing_ranks


class GradientCountError(UnisonError, AssertionError):
    """Gradients were produced or cleared at the wrong moment (Horovod raises AssertionError here)."""


class HorovodInternalError(UnisonError, RuntimeError):
    """A collective failed; the name and base class match Horovod's, so existing handlers keep working."""


class MismatchError(HorovodInternalError):
    """Ranks submitted the same collective with attributes that disagree (shape, dtype, op, ...)."""


class MissingGradientError(HorovodInternalError):
    """``missing_grads="error"``: some parameters produced no gradient on this rank before step()."""


class ShutdownError(HorovodInternalError):
    """The job was shut down while this operation was pending, or an op was submitted afterwards."""


class StallError(ShutdownError):
    """The stall inspector shut the job down because some ranks stopped submitting a collective."""


class AbortedError(HorovodInternalError):
    """Another rank failed and the job is being stopped."""


class JobInterrupt(KeyboardInterrupt):
    """The job stopped (another rank failed, a stall, a lost peer) while this rank's main thread ran its
    own code: raised there so that ``finally:`` blocks run, like Ctrl-C (``except KeyboardInterrupt``
    catches it). Uncaught, it ends the process with exit status 1, where a plain ``KeyboardInterrupt``
    would end it by SIGINT and make the job look interrupted or crashed."""


class RequestError(InvalidArgumentError):
    """A parameter server refused a request; the message is the server's reason."""


class TableFullError(RequestError):
    """A batch brought more new ids than a table's shard has room for."""


class NotDeclaredError(RequestError):
    """A request names a dense block or a table that the parameter server does not hold."""


class ConflictError(RequestError):
    """A request disagrees with what the parameter server holds, or with the job it was started for."""


class ServerUnavailableError(UnisonError, RuntimeError):
    """A parameter server did not answer (it is down, restarting too slowly, or unreachable)."""


class TrainerLostError(HorovodInternalError):
    """A synchronous step cannot complete because a trainer died, stopped or finished; the message names it."""


class HostsUpdatedInterrupt(UnisonError, RuntimeError):
    """The hosts of an elastic job changed; the job stops at this commit and goes on with the new hosts.

    Raised by ``state.commit()`` and ``state.check_host_updates()`` on every rank at the same call.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the hosts of the elastic job changed; stopping at this commit so the job "
                         "continues on the new hosts")
        self.skip_sync = skip_sync
