"""Writing files so that a failed run leaves nothing half-written behind."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path


def write_json_atomic(path: str | os.PathLike, data: object, *, indent: int | None = 1) -> None:
    """Write ``data`` as JSON to a temporary file beside ``path``, then rename it into place
    (gzipped where ``path`` ends in ``.gz``, as Chrome traces often are)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with (gzip.open if path.suffix == ".gz" else open)(tmp, "wt") as f:
            json.dump(data, f, indent=indent)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
