"""The progress lines of long commands (``replay``, ``runs export``) on stderr."""

from __future__ import annotations

import sys
import time

import click

__all__ = ["Progress"]

#: The clock replay's progress lines are spaced by (a test stops or speeds it).
_clock = time.monotonic


class Progress:
    """A long command's progress on stderr: a line about every ``every`` seconds (a single line
    redrawn in place on a terminal), none for a replay quicker than that; the summary after
    it always says how many frames were replayed. ``total`` None: not known (a gzip'd file
    read as it goes), the lines say the frames done without a percentage."""

    def __init__(self, total: int | None, every: float = 1.0) -> None:
        self.total, self.every = total, every
        self.tty = sys.stderr.isatty()
        self.last = _clock()
        self.width = 0

    def __call__(self, n: int) -> None:
        now = _clock()
        if (self.total is not None and n >= self.total) or now - self.last < self.every:
            return
        self.last = now
        if self.total is None:
            line = f"  {n} frames"
        else:
            line = f"  {n}/{self.total} frames ({100 * n // self.total} %)"
        if self.tty:
            click.echo("\r" + line.ljust(self.width), nl=False, err=True)
            self.width = len(line)
        else:
            click.echo(line, err=True)

    def close(self) -> None:
        """Clear the line redrawn in place, if any."""
        if self.width:
            click.echo("\r" + " " * self.width + "\r", nl=False, err=True)
            self.width = 0
