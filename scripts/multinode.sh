#!/usr/bin/env bash
# Multi-node training with Ray.
#   on the head:     ROLE=head bash scripts/multinode.sh
#   on each worker:  ROLE=worker HEAD=10.0.0.1 bash scripts/multinode.sh
#   then, on head:   ROLE=submit NNODES=4 PRESET=grpo_llds RETRIEVER_URL=http://10.0.0.1:8000/retrieve \
#                    bash scripts/multinode.sh [hydra overrides...]
# The retriever must be reachable from every node (start it with HOST=0.0.0.0 bash retrieval_launch.sh);
# the submit step checks that from every node before training starts.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
ROLE=${ROLE:?set ROLE=head|worker|submit}
case "$ROLE" in
  head)   exec ray start --head --dashboard-host=0.0.0.0 --port=6379 ;;
  worker) exec ray start --address="${HEAD:?set HEAD=<head ip>}:6379" ;;
  submit)
    case "$RETRIEVER_URL" in *127.0.0.1*|*localhost*)
      echo "error: RETRIEVER_URL=$RETRIEVER_URL is loopback; other nodes cannot reach it. Use the head's address." >&2; exit 1;; esac
    "$PY" - "$RETRIEVER_URL" <<'PYEOF'
import sys, ray, httpx
url = sys.argv[1].removesuffix("/retrieve") + "/health"
ray.init(address="auto")
@ray.remote(num_cpus=0)
def probe(u):
    import socket
    try:
        return socket.gethostname(), httpx.get(u, timeout=10).status_code
    except Exception as e:
        return socket.gethostname(), repr(e)
nodes = [n for n in ray.nodes() if n["Alive"]]
res = ray.get([probe.options(scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(url) for n in nodes])
bad = [r for r in res if r[1] != 200]
print("\n".join(f"{h}: {s}" for h, s in res))
sys.exit(f"error: the retriever is not reachable from {bad}" if bad else 0)
PYEOF
    exec ray job submit --address="http://127.0.0.1:8265" --working-dir . -- \
      python -m train.main --config-name "${PRESET:-grpo_llds}" \
      actor_rollout_ref.model.path="$MODEL" data.train_files="$DATA_DIR/train.parquet" \
      data.val_files="$DATA_DIR/test.parquet" trainer.n_gpus_per_node="$N_GPUS" trainer.nnodes="$NNODES" \
      search_r1.retriever_url="$RETRIEVER_URL" "$@" ;;
  *) echo "ROLE must be head, worker or submit" >&2; exit 2 ;;
esac
