#!/usr/bin/env bash
# Multi-node training with Ray.
#   on the head:     ROLE=head bash scripts/multinode.sh
#   on each worker:  ROLE=worker HEAD=10.0.0.1 bash scripts/multinode.sh
#   then, on head:   ROLE=submit NNODES=4 PRESET=grpo_llds RETRIEVER_URL=http://10.0.0.1:8000/retrieve \
#                    CKPT_DIR=/shared/ckpt/run1 DATA_DIR=/shared/data/processed bash scripts/multinode.sh [hydra overrides...]
# - The retriever must be reachable from every node (start it with HOST=0.0.0.0 bash retrieval_launch.sh).
#   Or one replica on every node, each node's rollouts searching their own (no node queues at the head's):
#     on each node:    ROLE=retriever NODE_IP=<this node's address> [RETRIEVER=e5 WIKI18=...] bash scripts/multinode.sh
#     then submit with RETRIEVER_URL='http://{node_ip}:8000/retrieve' ({node_ip}: the node a rollout runs on)
#   The replicas must serve the same index: the submit step compares what each one's /health reports.
# - CKPT_DIR and DATA_DIR must be absolute paths on storage every node shares (NFS, Lustre...): FSDP
#   shards are written by every node, and the job's working dir is a per-node temporary copy of this
#   repo's code only (data/, checkpoints/, runs/ and other outputs are excluded from the upload; Ray
#   refuses working dirs over its package size limit).
# - Ray authenticates by token: this script sets RAY_AUTH_MODE=token, and ROLE=head makes ~/.ray/auth_token
#   when the head has none; copy it to each worker (or set RAY_AUTH_TOKEN) first.
# - NODE_IP=<this node's address> picks the interface Ray advertises (several NICs); GLOO_SOCKET_IFNAME /
#   NCCL_SOCKET_IFNAME, when set at submit, reach every worker.
# - REHEARSAL=cpu: the same on CPU nodes (each node advertises N_GPUS logical GPUs and RAY_CPUS=8 CPUs; the preset plus the
#   CPU overlay, as the train_*.sh launchers; tests/test_multinode_on_cpu.py runs it on two network
#   namespaces of one machine).
# The submit step checks the retriever and both paths from every node before training starts.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
ROLE=${ROLE:?set ROLE=head|worker|retriever|submit}
# the ray beside the picked Python (a bare `ray` is missing outside an activated environment)
RAY_BIN=$(dirname "$PY")/ray
[ -x "$RAY_BIN" ] || RAY_BIN=$(command -v ray) \
  || { echo "error: no ray beside $PY nor on PATH (picked: $PY_WHY); install the project there" >&2; exit 1; }
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
has_ray_token() {  # where Ray looks for it: RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names, ~/.ray/auth_token
  [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -s "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ]
}
NODE=(); [ -n "${NODE_IP:-}" ] && NODE=(--node-ip-address="$NODE_IP")
# CPU nodes: one logical GPU slot per rank, and the logical CPUs a single-node CPU run gets (_cpu.yaml)
[ -n "$REHEARSAL" ] && NODE+=(--num-gpus="$N_GPUS" --num-cpus="${RAY_CPUS:-8}")
# What `ray job submit --working-dir .` must not upload (gitignore-style, relative to the repo).
EXCLUDES='["data/wiki18/", "data/processed/", "checkpoints/", "runs/", "outputs/", "wandb/", ".venv/", ".venv-*/", ".git/", "*.index", "*.parquet"]'
case "$ROLE" in
  retriever)  # a replica on this node's address, left running (its pid and log are printed)
    IP=${NODE_IP:?set NODE_IP=<the address of this node>: the replica binds it, and rollouts on this node reach it there}
    RPORT=${PORT:-8000}
    LOG=${RETRIEVER_LOG:-$PWD/runs/retriever-$IP.log}
    mkdir -p "$(dirname "$LOG")"
    HOST=$IP PORT=$RPORT nohup bash retrieval_launch.sh >"$LOG" 2>&1 &
    pid=$!
    "$PY" -m retrieval.client "http://$IP:$RPORT" --wait "${RETRIEVER_WAIT:-3600}" --pid "$pid" \
      || { echo "error: the retriever replica did not come up on http://$IP:$RPORT; its log: $LOG" >&2; exit 1; }
    echo "retriever replica: http://$IP:$RPORT (pid $pid, log $LOG); submit with RETRIEVER_URL='http://{node_ip}:$RPORT/retrieve'"
    exit 0 ;;
  head)
    if [ "$RAY_AUTH_MODE" = token ] && ! has_ray_token; then  # `ray start` does not make one (Ray 2.60)
      "$RAY_BIN" get-auth-token --generate >/dev/null
      chmod 600 "$HOME/.ray/auth_token"  # Ray writes it readable by every user of the machine
      echo "ray: made an authentication token at ~/.ray/auth_token; copy it to every worker node (or set RAY_AUTH_TOKEN there)"
    fi
    exec "$RAY_BIN" start --head --dashboard-host=0.0.0.0 --port=6379 "${NODE[@]}" ;;
  worker)
    if [ "$RAY_AUTH_MODE" = token ] && ! has_ray_token; then
      echo "error: no Ray authentication token on this node: copy the head's ~/.ray/auth_token to ~/.ray/auth_token here, or set RAY_AUTH_TOKEN" >&2
      exit 1
    fi
    exec "$RAY_BIN" start --address="${HEAD:?set HEAD=<head ip>}:6379" "${NODE[@]}" ;;
  submit)
    case "$RETRIEVER_URL" in *127.0.0.1*|*localhost*)
      echo "error: RETRIEVER_URL=$RETRIEVER_URL is loopback; other nodes cannot reach it. Use the head's address." >&2; exit 1;; esac
    CKPT_DIR=${CKPT_DIR:?set CKPT_DIR to an absolute checkpoint directory on storage every node shares}
    case "$CKPT_DIR" in /*) ;; *) echo "error: CKPT_DIR=$CKPT_DIR must be an absolute path on shared storage" >&2; exit 1;; esac
    case "$DATA_DIR" in /*) ;; *) echo "error: DATA_DIR=$DATA_DIR must be an absolute path on shared storage (the job's working dir holds code only)" >&2; exit 1;; esac
    mkdir -p "$CKPT_DIR"
    "$PY" -m train.cluster_check "$RETRIEVER_URL" "$CKPT_DIR" "$DATA_DIR/train.parquet" "$DATA_DIR/val_sample.parquet"
    PRESET=${PRESET:-grpo_llds}
    GEOM=$(preset_overrides "$PRESET") || exit 2
    [ -n "$REHEARSAL" ] && echo "rehearsal ($REHEARSAL): $PRESET with $GEOM on $NNODES nodes x $N_GPUS"
    # the job's environment (every node): the platform, offline settings and socket interfaces that are set here
    ENVS=$("$PY" -c 'import json, os, sys; print(json.dumps({k: os.environ[k] for k in sys.argv[1:] if os.environ.get(k)}))' \
      VERL_PLATFORM HF_HUB_OFFLINE TRANSFORMERS_OFFLINE WANDB_MODE RAY_AUTH_MODE GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME \
      TOKENIZERS_PARALLELISM RAY_DEDUP_LOGS)
    echo "python: $PY ($PY_WHY)"
    # shellcheck disable=SC2086
    exec "$RAY_BIN" job submit --address="http://127.0.0.1:8265" --working-dir . \
      --runtime-env-json "{\"excludes\": $EXCLUDES, \"env_vars\": $ENVS}" -- \
      "$PY" -m train.main --config-name "$PRESET" $GEOM \
      actor_rollout_ref.model.path="$MODEL" data.train_files="$DATA_DIR/train.parquet" \
      data.val_files="$DATA_DIR/val_sample.parquet" trainer.n_gpus_per_node="$N_GPUS" trainer.nnodes="$NNODES" \
      trainer.default_local_dir="$CKPT_DIR" "search_r1.retriever_url='$RETRIEVER_URL'" "$@" ;;
  *) echo "ROLE must be head, worker, retriever or submit" >&2; exit 2 ;;
esac
