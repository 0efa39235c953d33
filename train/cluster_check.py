"""python -m train.cluster_check RETRIEVER_URL PATH...: can every node of this Ray cluster run the job?

    python -m train.cluster_check http://10.0.0.1:8000/retrieve /shared/ckpt /shared/data/train.parquet

From each alive node (a Ray task pinned to it): the retriever's /health answers 200 (``{node_ip}`` in
the URL is that node's own address, for a replica per node), every PATH exists (storage all nodes
share), and all replicas serve the same index. Prints one line per node; exits 1 naming what is wrong.
``scripts/multinode.sh`` (ROLE=submit) runs it before submitting.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.cluster_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("retriever_url")
    ap.add_argument("paths", nargs="*", help="paths every node must see")
    args = ap.parse_args(argv)
    from train.trainer.cluster_probe import probe_nodes, problems

    try:
        reports = probe_nodes(args.retriever_url, args.paths)
    except ConnectionError as e:  # ray.init(address="auto") with no cluster on this machine
        print(f"error: no Ray cluster to check from here ({str(e).splitlines()[0][:200]}); start the head first: "
              "ROLE=head bash scripts/multinode.sh", file=sys.stderr)
        return 1
    for r in reports:
        print(f"{r.node}: retriever {r.status}, missing paths {list(r.missing) or 'none'}")
    found = problems(reports)
    for p in found:
        print(f"error: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
