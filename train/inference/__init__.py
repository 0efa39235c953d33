"""Answering questions outside training (``infer.py``, the evaluator).

- ``settings``     AskSettings: every setting of asking, one frozen object (flags, JSON for engine workers)
- ``asker``        one question -> a Search-R1 trajectory and answer; the factory from the settings
- ``results_file`` the one resumable results file (infer.py --file and the evaluator)
- ``backends``     vLLM's async engine, the hf engine's construction, the search client
- ``hf_engine``    a batching transformers engine that keeps a trajectory's KV cache between turns
- ``kv_cache``     its batch cache and prefix cache
- ``sampling``     the one reader of sampling parameters, the token sampler, the model loader
- ``hf_generate``  the ``model.generate`` reference backend (tests, benchmarks)
- ``cuda_probe``   GPU counting without CUDA initialisation (vLLM engines fork)
"""
