# Sourced first (before any cd) by the scripts that run stages one after another: scripts/demo.sh,
# scripts/reproduce_paper.sh, scripts/smollm2_answer.sh. The script re-runs itself as its own process group
# under this shell, which stays the script's PID. A TERM, INT or HUP sent to that PID alone (`kill PID`,
# `pkill -f demo.sh`, `timeout`, a job scheduler) is passed on as TERM to the whole group: the stage running
# then (a training run, an evaluation, a server) stops with the script instead of running on as an orphan.
# The script's exit status is the group's (143 when stopped so). Ctrl-C in a terminal works as before.
if [ -z "${_STAGES_GROUP:-}" ]; then
  export _STAGES_GROUP=$$  # the stages (and scripts they start) run in this one group
  _opts=; [[ $- == *x* ]] && _opts=-x
  set -m  # job control: the background job below gets a process group of its own
  "$BASH" $_opts "$0" "$@" </dev/null &  # no stage reads the terminal (a background group that tried would stop)
  _stages=$!
  set +m
  trap 'kill -s TERM -- "-$_stages" 2>/dev/null || true' TERM INT HUP
  while :; do
    wait "$_stages"; _rc=$?
    kill -0 "$_stages" 2>/dev/null || break  # a signal ended the wait, not the stages: wait for them
  done
  exit "$_rc"
fi
