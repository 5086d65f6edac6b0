"""Pass ``-x`` variables to the ranks through mpiexec's environment, never through a command line.

Every user of a machine can read every process's command line (``/proc/PID/cmdline``, ``ps``), but
only its owner can read its environment (``/proc/PID/environ``). So ``-x NAME=VALUE`` puts the value
in mpiexec's own environment, and the command line names the variable at most:

* MPICH (Hydra) passes its whole environment to every rank on every host by default (``-genvall``),
  through its own connections to the proxies, so nothing is added. If ``--mpi-args`` narrows that
  (``-genvnone``, ``-genvlist``), the names are added to the list (``-genvlist A,B``).
* Open MPI passes only what ``-x NAME`` names; without ``=VALUE`` it takes the value from its own
  environment.

``-x NAME=VALUE`` also puts the value on unisonrun's own command line; `hide_values` overwrites it
there (on Linux) as soon as unisonrun starts. Prefer ``-x NAME`` with the value in the environment.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping, Sequence

from ...errors import LaunchError

__all__ = ["env_pairs", "exported_settings", "hide_values", "name_flags", "nameable", "names_for_ranks"]

_NAMEABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a name POSIX shells export


def nameable(name: str) -> bool:
    """Whether a command line can name variable `name` (to mpiexec, to ``env``): a name POSIX shells export.

    Example:
        >>> [nameable(n) for n in ("KEY_2", "BASH_FUNC_f%%", "A,B", "-i", "")]
        [True, False, False, False, False]
    """
    return _NAMEABLE.fullmatch(name) is not None


def env_pairs(items: Sequence[str], environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The (name, value) of each ``-x NAME[=VALUE]``; a bare NAME takes its value from `environ`.

    Example:
        >>> env_pairs(["A=1", "B"], {"B": "2"})
        [('A', '1'), ('B', '2')]
        >>> env_pairs(["A,B=1"], {})
        Traceback (most recent call last):
        ...
        unison.errors.LaunchError: -x A,B=1: 'A,B' is not a variable name mpiexec can pass (letters, digits and _, not starting with a digit).
    """
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not name:
            raise LaunchError(f"-x needs NAME or NAME=VALUE. Got {item!r}.")
        if not nameable(name):
            raise LaunchError(f"-x {item}: {name!r} is not a variable name mpiexec can pass (letters, digits and "
                              "_, not starting with a digit).")
        if not sep:
            if name not in environ:
                raise LaunchError(f"-x {name}: {name} is not set in unisonrun's environment. Set it "
                                  f"(export {name}=...) or pass -x {name}=VALUE.")
            value = environ[name]
        pairs.append((name, value))
    return pairs


def exported_settings(environ: Mapping[str, str]) -> list[str]:
    """The ``UNISON_*`` and ``HOROVOD_*`` names set in `environ`: a launch names them to mpiexec, so
    that ranks on every host see the settings the launcher checked (Hydra passes its whole environment
    by default; Open MPI passes to other hosts only what ``-x`` names).

    Example:
        >>> exported_settings({"UNISON_CYCLE_TIME": "1", "PATH": "/bin", "HOROVOD_FUSION_THRESHOLD": "0"})
        ['UNISON_CYCLE_TIME', 'HOROVOD_FUSION_THRESHOLD']
    """
    return [name for name in environ if name.startswith(("UNISON_", "HOROVOD_"))]


def names_for_ranks(ranks_env: Mapping[str, str], own_env: Mapping[str, str]) -> list[str]:
    """What a launch names to mpiexec for the ranks' environment: every ``UNISON_*``/``HOROVOD_*`` setting
    in it (`exported_settings`), then every variable it sets that the launcher's own environment does
    not have or has with another value; each once.

    Example:
        >>> names_for_ranks({"PATH": "/bin", "UNISON_CYCLE_TIME": "1", "UNISON_LAUNCHER_DIR": "/d", "K": "2"},
        ...                 {"PATH": "/bin", "UNISON_CYCLE_TIME": "1", "K": "1"})
        ['UNISON_CYCLE_TIME', 'UNISON_LAUNCHER_DIR', 'K']
    """
    changed = [name for name, value in ranks_env.items() if own_env.get(name) != value]
    return list(dict.fromkeys([*exported_settings(ranks_env), *changed]))


def name_flags(vendor: str, names: Sequence[str], extra: Sequence[str]) -> tuple[list[str], list[str]]:
    """The mpiexec flags that pass `names` from mpiexec's environment, and `extra` adjusted for them.

    Returns ``(flags, extra)``: flags to add before the program, and the user's ``--mpi-args`` with
    Hydra's environment narrowing widened to include `names`. Only names a shell could export are
    named: another (bash's exported function ``BASH_FUNC_f%%``, common on clusters with environment
    modules; a comma, which would split ``-genvlist``) reaches the ranks of this host as mpiexec's own.

    Example:
        >>> name_flags("mpich", ["KEY"], [])
        ([], [])
        >>> name_flags("mpich", ["KEY"], ["-genvlist", "PATH"])
        ([], ['-genvlist', 'PATH,KEY'])
        >>> name_flags("openmpi", ["KEY", "KEY"], [])
        (['-x', 'KEY'], [])
        >>> name_flags("mpich", ["KEY"], ["-genvlist", "PATH", "-genvnone"])
        ([], ['-genvlist', 'PATH', '-genvlist', 'KEY'])
        >>> name_flags("openmpi", ["BASH_FUNC_module%%", "A,B", "KEY"], [])
        (['-x', 'KEY'], [])
    """
    extra = list(extra)
    names = [name for name in dict.fromkeys(names) if nameable(name)]  # once each, in order
    if not names:
        return [], extra
    if vendor == "openmpi":
        return [flag for name in names for flag in ("-x", name)], extra
    if "-genvnone" in extra:
        at = extra.index("-genvnone")
        extra[at : at + 1] = ["-genvlist", ",".join(names)]
    elif "-genvlist" in extra and extra.index("-genvlist") + 1 < len(extra):
        at = extra.index("-genvlist") + 1
        listed = [n for n in extra[at].split(",") if n]
        extra[at] = ",".join(listed + [n for n in names if n not in listed])
    return [], extra


def _argument_area() -> tuple[int, int] | None:
    """Start and end address of this process's command line (Linux: fields 48-49 of /proc/self/stat)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[45]), int(fields[46])  # fields[0] is field 3 (state)
    except (OSError, IndexError, ValueError):
        return None


def hide_values(items: Sequence[str]) -> int:
    """Overwrite the VALUE of each ``-x NAME=VALUE`` in this process's command line with ``*``.

    What ``ps`` and ``/proc/PID/cmdline`` show is the process's original argument memory; Python keeps
    its own copy in ``sys.argv``, so overwriting changes nothing for the program. Returns the number of
    values hidden (0 where this is not possible: not Linux, or an unusual argument layout).
    """
    secrets = [item for item in items if item.partition("=")[2]]
    area = _argument_area()
    if not secrets or area is None:
        return 0
    start, end = area
    if not 0 < start < end:
        return 0
    hidden = 0
    memory = ctypes.string_at(start, end - start)
    offset = 0
    for argument in memory.split(b"\0"):
        for item in secrets:
            encoded = item.encode()
            value = item.partition("=")[2].encode()
            if argument.endswith(encoded) and argument[: -len(encoded)] in (b"", b"-x", b"--env=", b"-x="):
                at = start + offset + len(argument) - len(value)
                ctypes.memset(at, ord("*"), len(value))
                hidden += 1
                break
        offset += len(argument) + 1
    return hidden
