"""python infer.py: ask a Search-R1 model a question and watch it search (``--help`` for everything).

The command lives in the package (train/infer.py: ``python -m train.infer``, or ``search-r1-infer`` once
installed); this file keeps ``python infer.py "..."`` working in a checkout.
"""

import sys

from train.infer import main

if __name__ == "__main__":
    sys.exit(main())
