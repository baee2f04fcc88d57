#!/usr/bin/env bash
# The main job: install, start the collector on SQLite (127.0.0.1), run the three demo
# training jobs streaming to it, print the dashboard URL and what happened. Extra arguments go to
# `logitwatch demo` (try --help: it installs nothing).
usage() {
  cat <<'HELP'
Usage: scripts/demo.sh [OPTIONS]

Creates .venv (if missing), installs logitwatch[hooks,server] into it (torch: the one .venv
already has, else a CPU build), then runs `logitwatch demo OPTIONS`: a collector on
127.0.0.1 and three tiny transformers training side by side, streaming to it: one whose
attention logits grow until its loss diverges, the same run with fuses on auto (QK-clip,
LR backoff) that train it through, and its healthy twin (QK-norm). The runs are
kept in the default store (~/.local/share/logitwatch/logitwatch.db, or $LOGITWATCH_HOME):
`logitwatch runs list` and `logitwatch serve` show them afterwards.

Options (passed on to `logitwatch demo`):
  --port INTEGER          Collector port (0: any free port).  [default: $LOGITWATCH_PORT,
                          else 8000]
  --db URL                Database of the demo collector (default: the default store).
  --steps INTEGER         Steps per job (default: each setting's own).
  --setting [unstable|fused|healthy]
                          Which jobs (default all three; repeatable).
  --seed INTEGER          Random seed of the jobs.  [default: 0]
  --serve / --exit        Keep the dashboard up after the jobs end (Ctrl-C to stop), or
                          stop at once.  [default: serve]
  -h, --help              Show this message and exit (nothing is installed).

Environment:
  PYTHON                  Interpreter that creates .venv (default: python3).
  LOGITWATCH_TORCH_INDEX  Where the CPU build of torch comes from (default:
                          https://download.pytorch.org/whl/cpu; empty: your pip
                          configuration only).
  LOGITWATCH_HOME         Home of the default store (default: ~/.local/share/logitwatch).
  LOGITWATCH_PORT         The collector's port when --port is not given (default: 8000).

To use a torch you already have (e.g. a GPU build) instead:
  python3 -m venv --system-site-packages .venv   # with the python3 that has it
  scripts/demo.sh                                # keeps that torch
HELP
}
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
  esac
done
source "$(dirname "$0")/_env.sh"
install_extras "hooks,server"
exec .venv/bin/logitwatch demo "$@"
