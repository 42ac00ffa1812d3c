"""Fetch the public GPU traces too large for tests/data (``benchmarks/public_traces.toml``).

    .venv/bin/python benchmarks/fetch_traces.py [--out benchmarks/traces] [--source DIR] [--list TOML]

Each trace is downloaded from its repository at the pinned commit (``--source DIR``: copied from
a local checkout of it instead, for a machine without the network) into ``OUT/<dir>/<file>``,
and kept only if its git blob id is the one the list records (the hash the repository's tree
holds for it). A trace already there with the right id is not fetched again.
``benchmarks/from_traces.py`` reads what is in ``OUT``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rich.progress import Progress

ROOT = Path(__file__).resolve().parent
LIST = ROOT / "public_traces.toml"
OUT = ROOT / "traces"
RAW = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"


@dataclass(frozen=True, kw_only=True)
class PublicTrace:
    """One trace of the list."""

    job: str
    dir: str
    file: str
    repo: str
    commit: str
    path: str
    git_blob: str
    what: str

    @property
    def url(self) -> str:
        return RAW.format(repo=self.repo, commit=self.commit, path=self.path)


def read_list(path: Path) -> list[PublicTrace]:
    """The traces of a list file; a one-line SystemExit where an entry is incomplete."""
    entries = tomllib.loads(path.read_text()).get("trace", [])
    traces = []
    for i, entry in enumerate(entries):
        try:
            traces.append(PublicTrace(**entry))
        except TypeError as e:
            raise SystemExit(f"error: {path}: trace {i + 1}: {e}") from None
    return traces


def git_blob_id(data: bytes) -> str:
    """The id git gives a file of ``data`` (SHA-1 of its blob header and content)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def fetch(trace: PublicTrace, out: Path, source: Path | None) -> str:
    """Bring ``trace`` into ``out``; what was done, in a few words. A ValueError if its content
    is not the listed blob (nothing is kept then)."""
    target = out / trace.dir / trace.file
    if target.is_file() and git_blob_id(target.read_bytes()) == trace.git_blob:
        return "already there"
    if source is not None:
        data = (source / trace.path).read_bytes()
    else:
        with urllib.request.urlopen(trace.url, timeout=120) as response:
            data = response.read()
    found = git_blob_id(data)
    if found != trace.git_blob:
        raise ValueError(
            f"{trace.path}: git blob {found}, the list says {trace.git_blob} (a changed or partial file): not kept"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".part")
    partial.write_bytes(data)
    partial.replace(target)
    return f"{len(data) / 2**20:.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--source", type=Path, help="a local checkout of the traces' repository")
    parser.add_argument("--list", type=Path, default=LIST, dest="listed")
    args = parser.parse_args(argv)
    traces = read_list(args.listed)
    failed = 0
    with Progress() as progress:
        task = progress.add_task("fetching", total=len(traces))
        for trace in traces:
            try:
                done = fetch(trace, args.out, args.source)
            except (OSError, ValueError) as e:
                failed += 1
                done = f"failed: {str(e).splitlines()[0]}"
            progress.console.print(f"{trace.dir}/{trace.file}: {done}", highlight=False, soft_wrap=True)
            progress.advance(task)
    if failed:
        print(f"error: {failed} of {len(traces)} traces not fetched", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
