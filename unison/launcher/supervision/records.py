"""The ranks' flight records of a failed job: kept out of the launcher's directory before it goes, and named.

Every rank of a job that stalls, deadlocks or loses a rank writes ``flight-<rank>.json`` into the
launcher's directory (`unison._job.flight_file`), which unisonrun removes when the job ends. For a
failure it reports, unisonrun moves them to its ``--output-filename`` directory, or to a new directory
in the system's temporary directory, and its report names it (`records_line`).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

__all__ = ["keep_records", "records_line"]

_PATTERN = "flight-*.json"


def keep_records(directory: Path, destination: Path | None = None) -> Path | None:
    """Move the flight records in `directory` to `destination` (made if needed), or to a new directory;
    return where they are now, or None when there were none (or they could not be moved)."""
    found = sorted(directory.glob(_PATTERN))
    if not found:
        return None
    try:
        if destination is None:
            destination = Path(tempfile.mkdtemp(prefix="unisonrun-flight-"))
        destination.mkdir(parents=True, exist_ok=True)
        for path in found:
            shutil.move(str(path), str(destination / path.name))
    except OSError:
        return None
    return destination


def records_line(directory: Path) -> str:
    """The report's line that names the records.

    Example:
        >>> records_line(Path("/tmp/out"))
        "  each rank's last collectives are in /tmp/out; python -m unison.launcher.flight /tmp/out shows them side by side."
    """
    return (f"  each rank's last collectives are in {directory}; python -m unison.launcher.flight {directory} "
            "shows them side by side.")
