"""Find the mpiexec that matches the MPI library mpi4py loads, and translate launcher options for it."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...errors import LaunchError
from .lines import RankTags
from .variables import name_flags, names_for_ranks

__all__ = ["MpiExec", "find_mpiexec", "library_vendor", "mpiexec_vendor"]

_PROBE = (
    "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
    "print(MPI.Get_library_version().strip().splitlines()[0])"
)


def library_vendor(text: str) -> str:
    """Name the MPI family from a library or mpiexec version string.

    Example:
        >>> library_vendor("MPICH Version:      5.0.2")
        'mpich'
        >>> library_vendor("mpiexec (OpenRTE) 4.1.2")
        'openmpi'
    """
    lowered = text.lower()
    if "intel" in lowered:
        return "intel"
    if "open mpi" in lowered or "openrte" in lowered or "open-mpi" in lowered or "prte" in lowered:
        return "openmpi"
    if "mpich" in lowered or "hydra" in lowered:
        return "mpich"
    return "unknown"


def mpiexec_vendor(version_output: str) -> str:
    """The MPI family of an ``mpiexec --version`` output (Hydra is MPICH's launcher)."""
    return library_vendor(version_output)


@functools.lru_cache(maxsize=1)
def loaded_library() -> str:
    """First line of the version of the MPI library mpi4py loads (probed in a child, MPI not initialized)."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise LaunchError("Probing the MPI library through mpi4py took over 60 s.") from exc
    if done.returncode != 0:
        raise LaunchError(
            "unisonrun needs mpi4py and an MPI library: `pip install mpi4py mpich` (the `mpi` extra of "
            f"unison; the mpich wheel brings mpiexec). Probing mpi4py failed:\n{done.stderr.strip()}"
        )
    return done.stdout.strip()


@dataclasses.dataclass(frozen=True)
class MpiExec:
    """An mpiexec executable, its MPI family, and how to spell unisonrun's options for it."""

    path: str
    vendor: str
    version: str

    def command(self, np: int, program: Sequence[str], *, hosts: str = "", hostfile: str = "",
                tag_output: bool = False, output_dir: str = "", env_names: Sequence[str] = (),
                env: Mapping[str, str] | None = None, extra: Sequence[str] = (), launcher_exec: str = "",
                iface: str = "", tags: RankTags | None = None) -> list[str]:
        """The full mpiexec command line for `program` on `np` processes.

        `env` is the environment mpiexec will run in (the ranks'): every variable in it that the
        launcher's own environment lacks or holds with another value, and every ``UNISON_*`` and
        ``HOROVOD_*`` setting, is named to mpiexec (`names_for_ranks`), since Open MPI passes to other
        hosts only what ``-x`` names and MPICH only what a narrowed ``-genvlist`` lists. `env_names`
        are named too, whatever their values (``-x NAME`` of a variable the launcher has as well). The
        command line, readable by every user, names variables at most, never their values.

        `launcher_exec` replaces ssh for starting processes on other hosts. `iface` names the network
        interface between hosts; with MPICH it also selects the TCP netmod (``ofi`` with the ``tcp``
        provider), because the wheel's default (UCX) may move data through shared memory instead, e.g.
        between network namespaces of one machine.

        `tags` (MPICH, `rank_tags`) make mpiexec mark each piece of the ranks' output with its rank.
        """
        cmd = [self.path, "-n", str(np)]
        openmpi = self.vendor == "openmpi"
        if hosts:
            cmd += ["-H" if openmpi else "-hosts", hosts]
        if hostfile:
            cmd += ["--hostfile" if openmpi else "-f", hostfile]
        if tag_output and openmpi:
            cmd += ["--tag-output"]
        elif tag_output and not output_dir:
            raise ValueError("Hydra's -prepend-rank tags chunks, not lines: pass output_dir and tail it")
        if output_dir:
            if openmpi:
                cmd += ["--output-filename", output_dir]
            else:
                cmd += ["-outfile-pattern", os.path.join(output_dir, "rank.%r.stdout"),
                        "-errfile-pattern", os.path.join(output_dir, "rank.%r.stderr")]
        if tags is not None and not openmpi:
            cmd += ["-prepend-pattern", tags.pattern]
        if launcher_exec:
            cmd += ["--mca", "plm_rsh_agent", launcher_exec] if openmpi else [
                "-launcher", "ssh", "-launcher-exec", launcher_exec]
        if iface:
            if openmpi:
                cmd += ["--mca", "btl_tcp_if_include", iface, "--mca", "oob_tcp_if_include", iface]
            else:
                # Fixed, public values: they may stand on the command line.
                network = [("MPIR_CVAR_CH4_NETMOD", "ofi"), ("FI_PROVIDER", "tcp"), ("FI_TCP_IFACE", iface)]
                cmd += ["-iface", iface]
                for name, value in network:
                    cmd += ["-genv", name, value]
        named = [*(names_for_ranks(env, os.environ) if env is not None else []), *env_names]
        flags, extra = name_flags(self.vendor, named, extra)
        return cmd + flags + extra + list(program)


def _version_of(path: str) -> str:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"Could not run `{path} --version`: {exc}") from exc
    return (done.stdout + done.stderr).strip()


def find_mpiexec(explicit: str = "", check: bool = True) -> MpiExec:
    """Choose the mpiexec for this Python and check it belongs to the MPI that mpi4py loads.

    Order: `explicit` (``--mpiexec``), the ``mpiexec`` next to this Python (the mpich wheel installs
    it there), then ``mpiexec`` on PATH.

    Raises:
        LaunchError: none found, or it belongs to another MPI than mpi4py's (every process would see
            itself as rank 0 of 1). The message names both and the fix.
    """
    if explicit:
        path = shutil.which(explicit) or explicit
        if not os.path.exists(path):
            raise LaunchError(f"--mpiexec {explicit!r}: no such executable.")
    else:
        beside = Path(sys.executable).parent / "mpiexec"
        found = str(beside) if beside.exists() else shutil.which("mpiexec")
        if found is None:
            raise LaunchError(
                "No mpiexec found next to this Python or on PATH. Install the mpich wheel with "
                "`pip install mpi4py mpich` (the `mpi` extra), or pass --mpiexec PATH."
            )
        path = found
    version = _version_of(path)
    vendor = mpiexec_vendor(version)
    if check:
        library = loaded_library()
        wanted = library_vendor(library)
        if "unknown" not in (vendor, wanted) and vendor != wanted:
            raise LaunchError(
                f"{path} belongs to a different MPI ({vendor}) than the library mpi4py loads "
                f"({library!r}, {wanted}): every process would start as rank 0 of a job of size 1. "
                f"Use the mpiexec of {wanted} (with the mpich wheel: {Path(sys.executable).parent}/mpiexec) "
                "by passing --mpiexec PATH or putting it first on PATH, or rebuild mpi4py against the "
                f"MPI of {path} (`pip install --no-binary mpi4py mpi4py`)."
            )
    match = re.search(r"Version:\s*(\S+)", version) or re.search(r"(\d+\.\d+(\.\d+)?)", version)
    return MpiExec(path, vendor, match.group(1) if match else "")
