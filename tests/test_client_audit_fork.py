"""The client's threads import nothing: a process forked while one of them is inside an
import leaves the child with that module's import lock held by a thread the child does not
have, and the child's own sender then blocks for ever on its first import (the lazy
``import httpcore`` of httpx's first ``Client``, the "idna" codec of the first connection).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import sys, threading, time

    class Recorder:
        \"\"\"A meta-path finder that only records who imports what (finds nothing).\"\"\"
        def __init__(self):
            self.seen = []
        def find_spec(self, name, path=None, target=None):
            self.seen.append((threading.current_thread().name, name))
            return None

    from logitwatch.client import Client, ClientConfig

    recorder = Recorder()
    sys.meta_path.insert(0, recorder)
    cfg = ClientConfig(spool_dir=sys.argv[2], interval=0.02, max_backoff=0.05,
                       spool_interval=0.1, timeout=2.0)
    c = Client(sys.argv[1], run="imports", config=cfg)
    for step in range(5):
        c.send(step, {"loss": 1.0}, {"attn.logit_max": [[1.0, 2.0]]})
    deadline = time.monotonic() + 60
    while (c.stats["retries"] < 2 or c.stats["spilled"] < 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert c.stats["retries"] >= 2 and c.stats["spilled"] >= 1, c.stats
    names = {t.name for t in threading.enumerate()}
    c.shutdown(1.0, finished=False)
    threads = sorted({t for t, _ in recorder.seen if t.startswith("logitwatch-")})
    print("client threads:", sorted(n for n in names if n.startswith("logitwatch-")))
    print("imported on the client's threads:",
          sorted({m for t, m in recorder.seen if t.startswith("logitwatch-")}), threads)
""")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_client_threads_import_nothing(tmp_path: Path) -> None:
    """The sender's first transport (httpx.Client) and first connection, and the spooler's
    first segment, import no module: importing the client imported them all."""
    url = f"http://localhost:{closed_port()}"  # a host name: the "idna" codec is needed
    done = subprocess.run([sys.executable, "-c", SCRIPT, url, str(tmp_path / "spool")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "client threads: ['logitwatch-sender', 'logitwatch-spooler']" in done.stdout
    assert "imported on the client's threads: [] []" in done.stdout, done.stdout


def test_importing_the_transport_imports_httpcore() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys; import logitwatch.client._http; "
         "print(sorted(m for m in ('httpcore', 'h11', 'certifi', 'encodings.idna') "
         "if m in sys.modules))"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['certifi',", "'encodings.idna',", "'h11',", "'httpcore']"]
