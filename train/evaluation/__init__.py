"""The paper's table (``python -m train.evaluate``).

- ``options``           the evaluator's arguments (read by the command and its engine workers)
- ``results``           the test rows and the resumable per-sample results file
- ``report``            the table beside the paper's row (``paper_results.json``), the speed line
- ``runner``            asking every row not yet answered, one engine or a pool
- ``pool``              one engine process per GPU; a dead engine's questions go to the others
- ``engine_worker``     one engine's process
- ``checkpoint_sweep``  every saved step of a run, the best one
"""
