# Shared by the train_*.sh launchers: environment defaults and the retriever preflight.
source "$(dirname "${BASH_SOURCE[0]}")/_python.sh"
MODEL=${MODEL:-Qwen/Qwen2.5-3B}
DATA_DIR=${DATA_DIR:-data/processed}
# REHEARSAL=cpu: the preset on a CPU machine with a tiny model (MODEL=a local path), 2 ranks; only what
# the hardware forces changes (configs/rehearsal/cpu.yaml, train/rehearsal.py).
REHEARSAL=${REHEARSAL:-}
case "$REHEARSAL" in
  "") ;;
  cpu) export VERL_PLATFORM=cpu; N_GPUS=${N_GPUS:-2} ;;
  *) echo "error: REHEARSAL=$REHEARSAL: the only rehearsal is REHEARSAL=cpu" >&2; exit 2 ;;
esac
N_GPUS=${N_GPUS:-8}
NNODES=${NNODES:-1}
RETRIEVER_URL=${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}
# wandb: without an account (no WANDB_API_KEY, no `wandb login`) train.main logs offline and says so.

check_retriever() {  # fail early, with the fix, when the retriever is not up
  # (which corpus it serves is train.main's check before Ray: search_r1.expect_corpus, train/trainer/corpus_check.py)
  local base=${RETRIEVER_URL%/retrieve}
  if ! "$PY" -m retrieval.client "$base"; then
    echo "error: no retrieval server answers at $base/health." >&2
    echo "  start one first: bash retrieval_launch.sh   (wiki-18 e5 on GPUs: RETRIEVER=e5 bash retrieval_launch.sh)" >&2
    exit 1
  fi
}

eval_backend() {  # BACKEND=vllm (batched; the GPU install) or hf (transformers, any device). Unset: vllm
  # when the picked Python has it, else hf, saying so. Prints the train.evaluate argument.
  local backend=${BACKEND:-}
  if [ -z "$backend" ]; then
    if "$PY" -c "import vllm" >/dev/null 2>&1; then backend=vllm; else
      backend=hf; echo "note: $PY has no vLLM: evaluating with BACKEND=hf (transformers; slow on 51,713 questions)" >&2; fi
  fi
  [ "$backend" = vllm ] && need_stack "BACKEND=vllm (BACKEND=hf: transformers, any device)" vllm
  echo "--backend $backend"
}

geometry() {  # preset -> overrides giving 10 updates per rollout batch on N_GPUS x NNODES ranks
  local ranks=$((N_GPUS * NNODES))
  # the presets' 520 / 52 prompts x 5 = 260 trajectories per mini-batch split over 1, 2, 4 ranks
  if [ "$1" != ppo ] && [ $((260 % ranks)) -ne 0 ]; then "$PY" -m train.geometry --ranks "$ranks"; fi
}

preset_overrides() {  # preset -> its geometry overrides for N_GPUS x NNODES ranks (+ the rehearsal's)
  local preset=$1 geom; geom=$(geometry "$preset")
  if [ -n "$REHEARSAL" ]; then
    geom="$geom $("$PY" -m train.rehearsal "$preset" --ranks $((N_GPUS * NNODES)) --nodes "$NNODES")" || return 2
  fi
  echo "$geom"
}

run_preset() {  # preset, extra hydra overrides...
  local preset=$1; shift
  check_retriever
  local geom; geom=$(preset_overrides "$preset") || exit 2
  if [ -n "$REHEARSAL" ]; then
    echo "rehearsal ($REHEARSAL): $preset with $geom"
  else
    need_stack "training (the presets roll out with vLLM)" vllm
  fi
  echo "python: $PY ($PY_WHY)"
  # shellcheck disable=SC2086
  exec "$PY" -m train.main --config-name "$preset" $geom \
    actor_rollout_ref.model.path="$MODEL" \
    data.train_files="$DATA_DIR/train.parquet" data.val_files="$DATA_DIR/val_sample.parquet" \
    trainer.n_gpus_per_node="$N_GPUS" trainer.nnodes="$NNODES" \
    search_r1.retriever_url="$RETRIEVER_URL" "$@"
}
