"""verl components swapped inside its workers.

- ``value_model``    the critic's value model, built with its configured attention
- ``critic_worker``  verl's critic worker using it
- ``logprobs``       a chunked log-prob kernel (registered as ``chunked``)
"""
