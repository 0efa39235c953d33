"""The tiny offline policy and the learnable task (tests, the demo, benchmarks): a 2-layer Qwen2 with a
BPE tokenizer trained on the bundled corpus, taught the protocol by a short SFT, and a task of invented
facts that GRPO visibly learns on CPU. The commands are ``python -m train.tiny`` and
``python -m train.learnable``."""
