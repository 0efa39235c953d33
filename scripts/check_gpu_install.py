"""Resolve the GPU install without installing it, and check what a GPU user would get.

    python scripts/check_gpu_install.py [--extras gpu,lucene,dev] [--report FILE] [--no-archs]
    make check-gpu-install      # with the active environment's python3 (builds no .venv)

Runs ``pip install --dry-run --ignore-installed --report`` of ``.[gpu,lucene,dev]`` (what the README
and environment.yml install) for this machine's platform, which must be Linux x86_64 with a Python
the project supports, and asserts:

- exactly one FAISS distribution, and it is faiss-gpu (the ``gpu`` extra's; every FAISS build writes the
  ``faiss/`` package, so faiss-cpu, faiss-gpu-cu12 or a second build beside it would clash);
- the attention backend the presets name is there: ``sdpa`` ships with torch; ``flash_attention_2``
  would need flash-attn, which has no binary wheel on PyPI, so it must not be the preset default;
- the torch / vLLM pair verl 0.9.1's vLLM extra pins (torch 2.11.0, vllm 0.24.0), and a transformers
  inside verl's range;
- the GPU architectures the resolved torch wheel has kernels for (the GPU search and training run on
  them): its ``libtorch_cuda.so`` is read from PyPI with HTTP range requests (about 300 MB of the
  wheel) and the CUDA fat binaries in it are listed; sm_80 (A100) and sm_90 (H100/H200) must be there;
- the GPU architectures of faiss-gpu's ``faiss/libfaiss.so`` (IVF search on GPUs): the wheel's entry is
  decompressed as a stream from its start, with ranged reads, only until the first fat binaries of its
  ``.nv_fatbin`` section are parsed (about 8 MB of the 135 MB wheel; every fat binary of a build has the
  same architectures: faiss-gpu 1.15.1's 182 all list sm_70-sm_90 + compute_90). Native code (SASS) for
  sm_80 and sm_90 must be there: PTX alone would have the driver compile ~180 MB of kernels at first use.

Needs PyPI. Standard library only, so it runs in any Python with pip. Exit 0 when every check passes.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import re
import struct
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from retrieval.cuda_arch import runs_on  # noqa: E402  (standard library only)

EXPECTED = {"torch": "2.11.0", "vllm": "0.24.0"}
TRANSFORMERS_RANGE = ((5, 5, 3), (5, 11, 0))  # verl 0.9.1: >=5.5.3, <5.11 (and != 5.6.0)
REQUIRED_ARCHS = ("sm_80", "sm_90")  # A100; H100 / H200
TORCH_CUDA_LIB = "torch/lib/libtorch_cuda.so"
FAISS_GPU = "faiss-gpu"  # the gpu extra's FAISS (pyproject.toml)
FAISS_GPU_LIB = "faiss/libfaiss.so"
FATBIN_HEADER = struct.Struct("<IHHQ")  # magic 0xBA55ED50, version 1, header size 16, payload size
FATBIN_START = struct.pack("<IHH", 0xBA55ED50, 1, 16)


def resolve(extras: str, report: Path) -> dict:
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--disable-pip-version-check", "--report", str(report), f"{ROOT}[{extras}]"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        err = "\n".join(line for line in r.stderr.splitlines() if "is ignored: it is neither" not in line)
        raise SystemExit(f"pip could not resolve .[{extras}]:\n{err[-4000:]}")
    return json.loads(report.read_text())


def dists_of(report: dict) -> dict[str, str]:
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in report["install"]}


def url_of(report: dict, name: str) -> str | None:
    for i in report["install"]:
        if i["metadata"]["name"].lower() == name:
            return (i.get("download_info") or {}).get("url")
    return None


def preset_attention() -> set[str]:
    """The attention backends the presets name (``attn_implementation: X`` lines outside comments)."""
    found = set()
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        for line in path.read_text().splitlines():
            m = re.match(r"\s*attn_implementation:\s*([A-Za-z0-9_]+)", line.split("#", 1)[0])
            if m:
                found.add(m.group(1))
    return found


class HTTPRangeFile(io.RawIOBase):
    """A read-only, seekable file over HTTP range requests (reads ahead ``block`` bytes)."""

    def __init__(self, url: str, block: int = 1 << 20):
        self.url, self.block, self.pos = url, block, 0
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60) as r:
            self.size = int(r.headers["Content-Length"])
            if r.headers.get("Accept-Ranges", "").lower() != "bytes":
                raise OSError(f"{url} does not serve byte ranges")
        self._buf_start, self._buf = 0, b""
        self.fetched = 0  # bytes read over HTTP

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=io.SEEK_SET):
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def _fetch(self, start: int, end: int) -> bytes:
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={start}-{end - 1}"})
        with urllib.request.urlopen(req, timeout=600) as r:
            data = r.read()
        self.fetched += len(data)
        return data

    def readinto(self, b):
        n = min(len(b), self.size - self.pos)
        if n <= 0:
            return 0
        lo, hi = self.pos - self._buf_start, self.pos - self._buf_start + n
        if lo < 0 or hi > len(self._buf):
            self._buf_start = self.pos
            self._buf = self._fetch(self.pos, min(self.size, self.pos + max(n, self.block)))
            lo, hi = 0, n
        b[:n] = self._buf[lo:hi]
        self.pos += n
        return n


def fatbin_archs(blob: bytes) -> set[str]:
    """The architectures of the CUDA fat binaries in a shared library: ``sm_XY`` for compiled code
    (SASS), ``compute_XY`` for PTX. Fat binary: magic 0xBA55ED50, u16 version, u16 header size,
    u64 payload size; entries: u16 kind (1 PTX, 2 ELF), u16, u32 entry header size, u64 size, ...,
    u32 arch at offset 28."""
    found, magic = set(), struct.pack("<I", 0xBA55ED50)
    pos = blob.find(magic)
    while pos != -1:
        _, header, size = struct.unpack_from("<HHQ", blob, pos + 4)
        p, end = pos + header, pos + header + size
        while p + 32 <= min(end, len(blob)):
            kind, _, entry_header, entry_size = struct.unpack_from("<HHIQ", blob, p)
            if kind not in (1, 2) or entry_header < 32:
                break
            arch = struct.unpack_from("<I", blob, p + 28)[0]
            found.add(f"{'compute' if kind == 1 else 'sm'}_{arch}")
            p += entry_header + entry_size
        pos = blob.find(magic, pos + 4)
    return found


def wheel_archs(url_or_path: str, member: str = TORCH_CUDA_LIB) -> set[str]:
    """The GPU architectures compiled into ``member`` of a wheel (a URL, read by ranges, or a file)."""
    src = HTTPRangeFile(url_or_path) if url_or_path.startswith(("http://", "https://")) else open(url_or_path, "rb")
    with src, zipfile.ZipFile(src) as z:
        return fatbin_archs(z.read(member))


def elf_fatbin_archs(stream, want: int = 4, chunk: int = 1 << 20) -> tuple[set[str], int, int]:
    """``(architectures, fat binaries read, bytes read)`` of the first ``want`` fat binaries of an ELF shared
    library read from ``stream`` (e.g. a zip member, decompressed as it is read), from its start.

    The ELF header is checked first; then the library is read until the first fat binary header (magic,
    version 1, 16-byte header) at an 8-byte boundary: the start of ``.nv_fatbin``, which nvcc fills with
    fat binaries back to back, each 8-byte aligned. The read stops after ``want`` of them, or at the
    section header table (``e_shoff``, the end of the sections) without finding one."""
    head = stream.read(64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", head, 0x28)[0]
    buf, base, archs, found = head, 0, set(), 0  # buf holds the bytes from offset `base` on
    pos = None  # offset of the next fat binary, once the first is found
    while True:
        if pos is None:
            at = buf.find(FATBIN_START)
            while at != -1 and (base + at) % 8:
                at = buf.find(FATBIN_START, at + 1)
            if at != -1:
                pos = base + at
            elif base + len(buf) >= shoff:
                break
            else:  # keep a tail that a header may straddle
                keep = len(FATBIN_START) - 1
                base, buf = base + len(buf) - keep, buf[-keep:]
        if pos is not None and base + len(buf) >= pos + FATBIN_HEADER.size:
            magic, version, header, size = FATBIN_HEADER.unpack_from(buf, pos - base)
            if (magic, version, header) != (0xBA55ED50, 1, 16):
                break  # the end of the fat binaries
            end = pos + header + size
            if base + len(buf) >= end:
                archs |= fatbin_archs(buf[pos - base: end - base])
                found += 1
                pos = end + (-end % 8)
                if found >= want:
                    break
                continue
        more = stream.read(chunk)
        if not more:
            break
        buf += more
        if pos is not None and pos - base > (64 << 20):  # drop what was parsed already
            cut = pos - base
            base, buf = base + cut, buf[cut:]
    return archs, found, base + len(buf)


def wheel_fatbin_archs(url_or_path: str, member: str = FAISS_GPU_LIB, want: int = 4) -> tuple[set[str], int, int]:
    """``(architectures, fat binaries read, bytes of the wheel read)`` of ``member``: the first ``want`` fat
    binaries, from a stream of the member (a URL is read by ranges)."""
    remote = url_or_path.startswith(("http://", "https://"))
    src = HTTPRangeFile(url_or_path) if remote else open(url_or_path, "rb")
    with src, zipfile.ZipFile(src) as z:
        info = z.getinfo(member)
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ValueError(f"{member} is stored with zip method {info.compress_type}, not stored or deflated")
        with z.open(info) as stream:
            archs, found, _ = elf_fatbin_archs(stream, want)
        return archs, found, src.fetched if remote else src.tell()


def arch_key(arch: str) -> tuple[int, str]:
    return int(re.sub(r"\D", "", arch) or 0), arch


def check_archs(archs: set[str], required=REQUIRED_ARCHS, *, what: str = "torch", native: bool = False,
                uses: str = "training and GPU search") -> list[str]:
    """Problems when ``archs`` has no code that runs on each of ``required``; with ``native``, PTX does not
    count (only compiled code, SASS)."""
    usable = sorted(a for a in archs if a.startswith("sm_")) if native else sorted(archs)
    missing = [need for need in required if not runs_on((int(need[3:-1]), int(need[-1])), usable)]
    return [f"the resolved {what} has no {'native ' if native else ''}GPU code for {', '.join(missing)} "
            f"(it has {' '.join(sorted(archs, key=arch_key)) or 'none'}"
            f"): {uses} would fail there with 'no kernel image is available'"
            f"{' or compile its PTX at first use' if native else ''}"] if missing else []


def check(dists: dict[str, str], attention: set[str]) -> list[str]:
    problems = []
    faiss = sorted(n for n in dists if n == "faiss" or n.startswith("faiss-"))
    if faiss != [FAISS_GPU]:
        problems.append(f"expected exactly one FAISS distribution, {FAISS_GPU} (the gpu extra's; every FAISS build "
                        f"writes the faiss/ package), got {faiss or 'none'}")
    for name, version in EXPECTED.items():
        if dists.get(name) != version:
            problems.append(f"{name}: expected {version} (verl 0.9.1's vLLM extra), got {dists.get(name)}")
    tf = dists.get("transformers")
    if tf is None:
        problems.append("transformers is not resolved")
    else:
        v = tuple(int(x) for x in tf.split(".")[:3] if x.isdigit())
        if not (TRANSFORMERS_RANGE[0] <= v < TRANSFORMERS_RANGE[1]) or tf == "5.6.0":
            problems.append(f"transformers {tf} is outside verl 0.9.1's range >=5.5.3,<5.11,!=5.6.0")
    if not attention:
        problems.append("no preset sets model.override_config.attn_implementation: verl would default to "
                        "flash_attention_2, which nothing installs")
    for impl in sorted(attention):
        if impl == "flash_attention_2" and "flash-attn" not in dists:
            problems.append("a preset uses flash_attention_2 but flash-attn is not in the install")
        elif impl not in ("sdpa", "eager", "flash_attention_2"):
            problems.append(f"unknown attention backend in a preset: {impl}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extras", default="gpu,lucene,dev")
    ap.add_argument("--report", default=None, help="keep pip's JSON report here")
    ap.add_argument("--no-archs", action="store_true",
                    help="skip reading the GPU architectures of the torch and faiss-gpu wheels")
    args = ap.parse_args(argv)
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        print(f"error: resolves for this machine's platform; run it on Linux x86_64 "
              f"(this is {platform.system()} {platform.machine()})", file=sys.stderr)
        return 2
    print(f"resolving .[{args.extras}] with {sys.executable} (pip --dry-run; nothing is installed)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        report = resolve(args.extras, Path(args.report or Path(tmp) / "report.json"))
    dists = dists_of(report)
    attention = preset_attention()
    faiss = [f"{n} {v}" for n, v in dists.items() if n.startswith("faiss")]
    print(f".[{args.extras}] resolves {len(dists)} distributions: torch {dists.get('torch')}, vllm "
          f"{dists.get('vllm')}, transformers {dists.get('transformers')}, {', '.join(faiss) or 'no faiss'}; "
          f"flash-attn {'yes' if 'flash-attn' in dists else 'no'}; preset attention {sorted(attention)}")
    problems = check(dists, attention)
    if not args.no_archs:
        url = url_of(report, "torch")
        if not url:
            problems.append("pip's report has no download URL for torch")
        else:
            print(f"reading the GPU architectures of {url.rsplit('/', 1)[-1]} ({TORCH_CUDA_LIB}) ...", flush=True)
            archs = wheel_archs(url)
            print(f"torch {dists.get('torch')} GPU code (training and GPU search): "
                  f"{' '.join(sorted(archs, key=arch_key)) or 'none'}")
            problems += check_archs(archs)
        url = url_of(report, FAISS_GPU)
        if FAISS_GPU in dists and not url:
            problems.append(f"pip's report has no download URL for {FAISS_GPU}")
        elif url:
            print(f"reading the GPU architectures of {url.rsplit('/', 1)[-1]} ({FAISS_GPU_LIB}, its first fat "
                  f"binaries) ...", flush=True)
            archs, found, read = wheel_fatbin_archs(url)
            print(f"{FAISS_GPU} {dists.get(FAISS_GPU)} GPU code (IVF search on GPUs): "
                  f"{' '.join(sorted(archs, key=arch_key)) or 'none'} ({found} fat binaries, {read / 1e6:.1f} MB "
                  f"of the wheel read)")
            problems += check_archs(archs, what=FAISS_GPU, native=True, uses="IVF search on GPUs")
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    if not problems:
        print(f"ok: one FAISS ({FAISS_GPU}), torch/vLLM pair as pinned, attention backend available"
              f"{'' if args.no_archs else ', torch and faiss-gpu code for ' + ' and '.join(REQUIRED_ARCHS)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
