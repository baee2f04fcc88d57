"""Where logitwatch keeps its data by default: one home per user, the same from any
directory (stdlib only; the client, the collector and the CLI all use it).

* ``LOGITWATCH_HOME``, when set, is the home;
* else the platform's per-user data directory: ``$XDG_DATA_HOME/logitwatch`` (default
  ``~/.local/share/logitwatch``) on Linux and other Unix systems,
  ``~/Library/Application Support/logitwatch`` on macOS, ``%LOCALAPPDATA%\\logitwatch``
  on Windows.

The collector's default store is the SQLite file ``<home>/logitwatch.db``
(:func:`default_db_url`), shared by ``logitwatch serve``, ``runs``, ``alerts``,
``retention``, ``token``, ``replay`` (its rules) and ``demo``. ``--db URL`` or
``LOGITWATCH_DB_URL`` choose another store.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DB_FILE", "default_db_url", "home"]

#: The default store's file name inside the home.
DB_FILE = "logitwatch.db"


def home(env: Mapping[str, str] | None = None) -> Path:
    """The home directory (not created here): ``LOGITWATCH_HOME``, else the per-user data
    directory of the platform (see the module docstring)."""
    env = os.environ if env is None else env
    explicit = env.get("LOGITWATCH_HOME", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "logitwatch"
    if os.name == "nt":
        base = env.get("LOCALAPPDATA", "").strip()
        return (Path(base) if base else Path.home() / "AppData" / "Local") / "logitwatch"
    data = env.get("XDG_DATA_HOME", "").strip()
    # The XDG spec: a relative XDG_DATA_HOME is invalid and is ignored.
    base = Path(data) if data and os.path.isabs(data) else Path.home() / ".local" / "share"
    return base / "logitwatch"


def default_db_url(env: Mapping[str, str] | None = None) -> str:
    """The default store: ``sqlite:///<home>/logitwatch.db`` (an absolute path, so every
    command finds the same file from any directory)."""
    return f"sqlite:///{home(env).resolve() / DB_FILE}"
