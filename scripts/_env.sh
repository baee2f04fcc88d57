# Shared by scripts/demo.sh and scripts/test.sh: a virtual environment in .venv and the
# packages installed into it. torch: the one .venv already has, whatever its build (e.g. a
# GPU build: create .venv with --system-site-packages from a Python that has it); else a CPU
# build of the version pinned in constraints-cpu.txt, from the PyTorch CPU index on Linux
# (PyPI's Linux torch is the multi-GB CUDA build).
#
# Environment: PYTHON (the interpreter that creates .venv; python3), LOGITWATCH_TORCH_INDEX
# (where the CPU build comes from; default https://download.pytorch.org/whl/cpu; empty: only
# your pip configuration).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
TORCH_INDEX=${LOGITWATCH_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)

make_venv() {
  # a .venv whose pip is missing (made by a Python without ensurepip: Debian's python3
  # without python3-venv) is made again, not reused
  if [ -x .venv/bin/python ] && ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    echo "==> .venv has no pip (an earlier creation failed): making it again"
    rm -rf .venv
  fi
  if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv"
    if ! "$PY" -m venv .venv; then
      rm -rf .venv
      echo "error: '$PY -m venv' failed; on Debian or Ubuntu install python3-venv" \
           "(sudo apt-get install python3-venv), or set PYTHON to another Python 3.10+" >&2
      exit 1
    fi
  fi
}

# The pip arguments that fetch torch: --index-url of the CPU index when on Linux and the
# index answers; nothing (your pip configuration) otherwise, and then say so.
torch_index_args() {
  [ "$(uname -s)" = Linux ] && [ -n "$TORCH_INDEX" ] || return 0
  if "$PY" - "$TORCH_INDEX" <<'EOF' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
EOF
  then
    echo "--index-url $TORCH_INDEX"
  else
    echo "==> $TORCH_INDEX does not answer: torch comes from your pip configuration" >&2
  fi
}

install_torch() {
  if .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "==> keeping the torch .venv has: $(.venv/bin/python -W ignore -c \
      'import torch; print(torch.__version__, "CUDA", torch.version.cuda or "none")')"
    return 0
  fi
  local args
  args=$(torch_index_args)
  echo "==> installing torch (CPU build, pinned by constraints-cpu.txt)${args:+ from ${args#--index-url }}"
  # shellcheck disable=SC2086  # $args is empty or two words
  "${PIP[@]}" -c constraints-cpu.txt $args torch
  # -W ignore: numpy comes with logitwatch's extras, after this check (torch warns without it)
  .venv/bin/python -W ignore -c 'import torch, sys
if torch.version.cuda:
    print(f"==> note: torch {torch.__version__} is a CUDA build", file=sys.stderr)'
}

install_extras() {  # $1: extras, e.g. "hooks,server"
  make_venv
  install_torch
  echo "==> installing logitwatch[$1] into .venv"
  # torch is installed by now: pip keeps it (any build, any version >= the extra's minimum)
  "${PIP[@]}" -e ".[$1]"
}
