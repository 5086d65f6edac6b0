"""The program each rank of `unison.run` executes: load the pickled call, run it, write the outcome.

Under the elastic driver the outcome goes to ``epoch-N/`` of the job directory (a rank number names a
different process in each membership epoch), and a rank that ends for a host change (``SystemExit``
with `HOSTS_UPDATED_EXIT`, raised by the elastic ``run`` wrapper after its commit) writes nothing.
"""

from __future__ import annotations

import json
import pickle
import runpy
import sys
import traceback
import types
from pathlib import Path
from typing import Any

from ..._contract import (
    HOSTS_UPDATED_EXIT,
    JOB_FILE,
    META_FILE,
    epoch_directory,
    error_file,
    result_file,
    untrusted_directory,
    write_atomically,
)


def _rank() -> int:
    from ..._job import runtime as _runtime
    from ...config import process_environment

    if _runtime.is_initialized():
        return _runtime.rank()
    env = process_environment()
    for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        if key in env:
            return int(env[key])
    return 0


def _outcome_directory(directory: Path) -> Path:
    from ...config import load_settings

    settings = load_settings()
    if not settings.elastic_driver:
        return directory
    path = directory / epoch_directory(settings.elastic_epoch)
    path.mkdir(exist_ok=True)
    return path


def main(directory: Path) -> int:
    """Run the job in `directory` on this rank; return the process exit status."""
    job = _load(directory)
    # The epoch is read when the call ends: an elastic job's survivor keeps its process (and this call)
    # through every epoch it re-forms in, and its outcome belongs to the epoch it ended in.
    try:
        result = job["fn"](*job["args"], **job["kwargs"])
    except SystemExit as exc:
        out = _outcome_directory(directory)
        if out != directory and exc.code in (0, None):
            return 0  # an elastic worker the job goes on without (its host left)
        if exc.code != HOSTS_UPDATED_EXIT or out == directory:
            return _failed(out, exc)
        return HOSTS_UPDATED_EXIT
    except BaseException as exc:  # noqa: BLE001 - reported to the caller, then the job is stopped
        return _failed(_outcome_directory(directory), exc)
    _write(_outcome_directory(directory), result_file(_rank()), result)
    return 0


def _failed(directory: Path, exc: BaseException) -> int:
    """Write `exc` for the caller and stop the job; return the exit status."""
    info: dict[str, object] = {"type": type(exc).__name__, "message": str(exc),
                              "traceback": traceback.format_exc()}
    try:
        pickle.dumps(exc)
        info["exception"] = exc
    except Exception:  # noqa: BLE001 - an unpicklable exception travels as text only
        pass
    _write(directory, error_file(_rank()), info)
    traceback.print_exc()
    from ..._job.failure import abort_job

    abort_job(exc)
    return 1


def _load(directory: Path) -> dict[str, Any]:
    # The job directory's path is predictable and its files are run and unpickled: another user of a
    # host could make it first there. Only a directory this user owns, that no one else can write, is read.
    problem = untrusted_directory(directory)
    if problem is not None:
        raise PermissionError(f"unison.run's job directory {directory} {problem}: its function and arguments "
                              "are unpickled from it, so it must be this user's and private; not loading it.")
    # The function may live in the caller's main script: restore the caller's sys.path and import
    # that script as __mp_main__ (so its `if __name__ == "__main__":` block stays off) before unpickling.
    meta = json.loads((directory / META_FILE).read_text())
    for entry in reversed(meta["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if meta["main_path"] and "__mp_main__" not in sys.modules:
        module = types.ModuleType("__mp_main__")
        module.__file__ = meta["main_path"]
        sys.modules["__mp_main__"] = module
        module.__dict__.update(runpy.run_path(meta["main_path"], run_name="__mp_main__"))

    class Loader(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            return super().find_class("__mp_main__" if module == "__main__" else module, name)

    with open(directory / JOB_FILE, "rb") as f:
        job: dict[str, Any] = Loader(f).load()
    return job


def _write(directory: Path, name: str, value: object) -> None:
    write_atomically(directory / name, pickle.dumps(value))


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
