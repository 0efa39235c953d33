"""LLDS, the method (arXiv 2512.04220).

- ``penalty``  the penalty math, pure torch (no verl import)
- ``loss``     the actor loss: verl's policy loss plus the penalty, installed with ``set_loss_fn``
- ``drift``    SAPO's drift penalty (arXiv 2603.10069), the rival fix, pure torch
"""
