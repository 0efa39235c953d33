"""The paper's table (``python -m train.evaluate``).

- ``options``           the evaluator's arguments -> EvalOptions (holding the AskSettings every engine gets)
- ``results``           the test rows, the rows already evaluated, EM per source
- ``report``            the table beside the paper's row (``paper_results.json``), the speed line
- ``runner``            asking every row not yet answered, one engine or a pool
- ``pool``              one engine process per GPU; a dead engine's questions go to the others
- ``engine_worker``     one engine's process (gets the AskSettings whole, as JSON)
- ``checkpoint_sweep``  every saved step of a run, the best one
"""
