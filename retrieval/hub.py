"""python -m retrieval.hub REPO PATTERN DEST: one download of wiki-18 assets from the Hugging Face hub.

    python -m retrieval.hub PeterJinGo/wiki-18-corpus "wiki-18.jsonl.gz" data/wiki18

What ``scripts/download_wiki18.sh`` calls for each asset (the corpus, Search-R1's e5 flat index, its
HNSW64 and BM25 indexes); the script checks sizes and line counts around it. Files matching PATTERN
land under DEST with the repository's own folders (``bm25/*`` lands in ``DEST/bm25``). A failed
download exits 2 naming the repository (``docs/errors.md``); ``HF_HUB_OFFLINE=1`` makes it fail at once.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from retrieval.errors import UserError, exit_on_error


def download(repo: str, pattern: str, dest: str) -> str:
    """The files of dataset ``repo`` matching ``pattern`` into ``dest``; returns ``dest``."""
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id=repo, repo_type="dataset", allow_patterns=[pattern], local_dir=dest)


@exit_on_error
def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m retrieval.hub", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repo", help="a dataset repository on the hub, e.g. PeterJinGo/wiki-18-corpus")
    ap.add_argument("pattern", help="which of its files, e.g. 'part_*' or 'bm25/*'")
    ap.add_argument("dest", help="the local folder")
    args = ap.parse_args(argv)
    try:
        download(args.repo, args.pattern, args.dest)
    except Exception as e:  # the hub's errors are many (offline, 404, auth, disk): one line naming the asset
        raise UserError(f"downloading {args.pattern} of {args.repo} into {args.dest} failed: "
                        f"{type(e).__name__}: {str(e)[:400]}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
