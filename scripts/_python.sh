# Sourced by every launcher: PY = the Python that has this project installed, and PY_WHY = why that one.
# The environment the user chose wins over the repo's CPU test environment (.venv, made by `make`):
#   1. $PYTHON, if set;
#   2. the active virtualenv ($VIRTUAL_ENV) or conda env ($CONDA_PREFIX), if it has the project;
#   3. `python` / `python3` on PATH, if it has the project (`pip install -e '.[gpu,...]'` into the system Python);
#   4. the repo's .venv (the CPU stack: tests, the demo, rehearsals).
# A launcher that needs more than the project (vLLM, a CUDA torch) calls `need_stack` to check PY has it.
_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_has_project() {  # installed, not just importable from the repo folder (run from / for that reason)
  [ -n "$1" ] && (cd / && "$1" -c "import importlib.metadata as m, train, retrieval; m.version('search-r1-llds')") \
    >/dev/null 2>&1
}
PY= PY_WHY=
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON PY_WHY="\$PYTHON"
else
  for _env in "${VIRTUAL_ENV:-}" "${CONDA_PREFIX:-}"; do
    if [ -n "$_env" ] && _has_project "$_env/bin/python"; then
      PY=$_env/bin/python PY_WHY="the active environment $_env"; break
    fi
  done
  if [ -z "$PY" ]; then
    for _cand in python python3; do
      if command -v "$_cand" >/dev/null 2>&1 && _has_project "$(command -v "$_cand")"; then
        PY=$(command -v "$_cand") PY_WHY="$_cand on PATH"; break
      fi
    done
  fi
  if [ -z "$PY" ] && [ -x "$_repo/.venv/bin/python" ]; then
    PY=$_repo/.venv/bin/python PY_WHY="the repo's .venv (CPU test stack; no active environment has the project)"
  fi
fi
if ! _has_project "$PY"; then
  echo "error: no Python with this project installed (tried: ${PY:-\$PYTHON, the active environment, python on PATH, .venv});" \
    "install it (pip install -e '.[gpu,lucene,dev]' into your environment, or make install for .venv) or set PYTHON=" >&2
  exit 1
fi

need_stack() {  # need_stack WHAT MODULE...: PY must import these modules, else say which Python was picked and why
  local what=$1 missing=(); shift
  for m in "$@"; do "$PY" -c "import $m" >/dev/null 2>&1 || missing+=("$m"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "error: $what needs ${missing[*]}, which $PY lacks (picked: $PY_WHY)." >&2
    echo "  Activate the environment you installed with pip install -e '.[gpu,lucene,dev]', or set PYTHON=/path/to/python." >&2
    exit 1
  fi
}
unset _repo _env _cand
