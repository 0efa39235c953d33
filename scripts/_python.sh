# Sourced by every launcher: PY = the Python that has this project installed.
#   $PYTHON if set; else the repo's .venv (made by `make`); else the active environment's python
#   (`pip install -e '.[gpu,...]'` into conda or the system Python), python3 or python.
_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -x "$_repo/.venv/bin/python" ]; then
  PY=$_repo/.venv/bin/python
elif command -v python >/dev/null 2>&1 && python -c "import train" >/dev/null 2>&1; then
  PY=python
else
  PY=python3
fi
if ! "$PY" -c "import train, retrieval" >/dev/null 2>&1; then
  echo "error: $PY cannot import this project; install it (make install, or pip install -e '.[gpu,lucene,dev]') or set PYTHON=" >&2
  exit 1
fi
unset _repo
