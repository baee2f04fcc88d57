#!/usr/bin/env bash
# The main job: install, start the collector on SQLite (127.0.0.1), run the demo training
# jobs streaming to it, print the dashboard URL and what happened. Extra arguments go to
# `logitwatch demo` (try --help).
source "$(dirname "$0")/_env.sh"
install_extras "hooks,server"
exec .venv/bin/logitwatch demo "$@"
