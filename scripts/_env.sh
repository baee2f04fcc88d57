# Shared by scripts/demo.sh and scripts/test.sh: a virtual environment in .venv with the
# CPU build of torch pinned (an open torch requirement can pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi
install_extras() {  # $1: extras, e.g. "hooks,server"
  echo "==> installing logitwatch[$1] into .venv (torch pinned by constraints-cpu.txt)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints-cpu.txt -e ".[$1]"
}
