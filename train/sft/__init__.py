"""Supervised warm starts: teaching a policy the Search-R1 format before RL.

- ``supervised.py``    the SFT loop on (text, trained?) trajectories: loss on the policy's own turns
                       and the final EOS, never on observation tokens
- ``trajectories.py``  trajectories from a training split: search with the question through a real
                       retriever, read what it returns, answer with the gold answer
The command: ``python -m train.warm_start`` (the tiny toy policy's warm start is ``python -m train.tiny``).
"""
