"""The GPU check (``python -m train.gpu_check``, the console script ``search-r1-gpu-check``): every GPU path
that needs no vLLM, verl or Ray, checked on one GPU in a few minutes, one table, non-zero on a mismatch.

- ``runner``       the parts in order, timed, a crashing part a mismatch, the transformers-5 parts skipped
                   under another major version
- ``report``       the table's rows (ok / MISMATCH / info)
- ``environment``  verl stand-ins, the tiny model, device memory, transformers against the pin, torch's
                   per-thread cuBLAS workspaces
- ``fork``         CUDA then fork, and the evaluator's path up to the vLLM engine (the stand-in vllm)
- ``hf_kv``        the hf engine's kept KV caches and the device memory they hold
- ``search``       flat GPU search against exact fp32, and the retrieval batcher's one device thread
- ``kernels``      chunked log-probs, packed attention, the critic's model build

Importing a module here imports neither torch nor transformers; the parts import them when they run.
"""
