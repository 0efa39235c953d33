"""Answering questions outside training (``infer.py``, the evaluator).

- ``asker``        one question -> a Search-R1 trajectory and answer; the flags and factory both commands use
- ``backends``     vLLM's async engine, the search client, the vLLM engine flags
- ``hf_engine``    a batching transformers engine that keeps a trajectory's KV cache between turns
- ``kv_cache``     its batch cache and prefix cache
- ``sampling``     the one reader of sampling parameters, the token sampler, the model loader
- ``hf_generate``  the ``model.generate`` reference backend (tests, benchmarks)
- ``cuda_probe``   GPU counting without CUDA initialisation (vLLM engines fork)
"""
