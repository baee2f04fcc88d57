"""Regenerate ``logitwatch/demo/data/corpus.txt``, the demo's offline English corpus.

The corpus is the documentation of the Python standard library, read from the running
interpreter with :func:`inspect.getdoc`: for each module in a fixed list, the module
docstring followed by the docstrings of its public classes, their public methods and its
public functions, in sorted order. The text is cleaned to printable ASCII (tabs become
spaces, other characters are dropped), runs of blank lines are collapsed, lines that
mention a machine path of this interpreter are removed, and the result is cut at
``MAX_BYTES`` on a paragraph boundary.

Run it from the repository root (any CPython 3.10+; the exact text depends on the
Python version, the committed file was made with CPython 3.11)::

    python bench/make_corpus.py            # writes logitwatch/demo/data/corpus.txt
    python bench/make_corpus.py --check    # only prints the size it would write
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import string
import sys
import warnings
from pathlib import Path

MAX_BYTES = 450_000
OUT = Path(__file__).resolve().parent.parent / "logitwatch" / "demo" / "data" / "corpus.txt"

MODULES = [
    "abc", "argparse", "array", "ast", "asyncio", "base64", "bisect", "calendar", "cmd",
    "codecs", "collections", "configparser", "contextlib", "copy", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "email", "enum", "fractions", "ftplib", "functools",
    "getopt", "gettext", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "http.client",
    "http.cookiejar", "imaplib", "inspect", "io", "ipaddress", "itertools", "json", "locale",
    "logging", "mailbox", "math", "mimetypes", "numbers", "operator", "optparse", "os",
    "pathlib", "pickle", "pprint", "queue", "random", "re", "sched", "secrets", "selectors",
    "shelve", "shlex", "shutil", "smtplib", "socket", "sqlite3", "statistics", "string",
    "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "time",
    "timeit", "tokenize", "traceback", "turtle", "typing", "unittest", "urllib.parse",
    "urllib.request", "uuid", "warnings", "weakref", "xml.dom.minidom", "zipfile", "zlib",
]

PRINTABLE = set(string.printable) - set("\x0b\x0c\r")


def _docs_of(module_name: str) -> list[str]:
    """Return the docstrings of one module, its public classes, methods and functions."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = importlib.import_module(module_name)
    except Exception:  # a module missing in this build (e.g. turtle without tkinter)
        return []
    docs = [inspect.getdoc(mod) or ""]
    for name, obj in sorted(vars(mod).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        if inspect.isclass(obj):
            docs.append(inspect.getdoc(obj) or "")
            for mname, meth in sorted(vars(obj).items()):
                if not mname.startswith("_") and inspect.isfunction(meth):
                    docs.append(inspect.getdoc(meth) or "")
        elif inspect.isfunction(obj):
            docs.append(inspect.getdoc(obj) or "")
    return docs


def _clean(text: str, forbidden: list[str]) -> str:
    text = text.replace("\t", "    ")
    text = "".join(ch for ch in text if ch in PRINTABLE)
    lines = [ln.rstrip() for ln in text.splitlines()]
    lines = [ln for ln in lines if not any(f in ln for f in forbidden)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def build() -> str:
    """Build the corpus text (deterministic for one Python version)."""
    forbidden = sorted({p for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                    os.path.expanduser("~"), os.getcwd()) if len(p) > 1})
    seen: set[str] = set()
    paragraphs: list[str] = []
    for name in MODULES:
        for doc in _docs_of(name):
            doc = _clean(doc, forbidden)
            if len(doc) < 80 or doc in seen:  # skip stubs and inherited duplicates
                continue
            seen.add(doc)
            paragraphs.append(doc)
    out, size = [], 0
    for p in paragraphs:
        if size + len(p) + 2 > MAX_BYTES:
            break
        out.append(p)
        size += len(p) + 2
    return "\n\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="print the size only")
    args = parser.parse_args()
    text = build()
    if args.check:
        print(f"{len(text)} bytes")
        return
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="ascii")
    print(f"wrote {len(text)} bytes to {OUT.relative_to(OUT.parents[3])}")


if __name__ == "__main__":
    main()
