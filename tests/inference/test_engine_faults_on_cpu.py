"""Inference engines on first contact with a GPU, shown on CPU: no CUDA initialisation before a vLLM
engine is built (a forked EngineCore would die), vLLM settings written out, the hf engine's kept KV
caches own exactly their rows and are bounded and dropped, out-of-memory and dead engines, and
``infer.py --file`` writing each answer as it finishes and resuming."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from verl.workers.rollout.replica import TokenOutput

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from train import infer  # noqa: E402

# The stand-in vllm (train/gpucheck/fork.py): a GPU platform, and an engine whose construction records
# what CUDA calls this process made before it, then stops the run (nothing past the engine's start is
# under test).
ENGINE_RECORDS = """
import json, os
import torch
rec = {"cuda_calls": list(torch._fake_cuda_calls), "engine_args": args.kw,
       "start_method": os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")}
with open(os.environ["FAKE_VLLM_RECORD"], "w") as f:
    json.dump(rec, f)
raise SystemExit(17)
"""
# Runs first in the child: torch's CUDA entry points are recorded. On a CUDA build each of them runs
# cuInit (is_available without PYTORCH_NVML_BASED_CUDA_CHECK=1: torch._C._cuda_getDeviceCount;
# device_count when NVML cannot answer) or initialises CUDA (init, _lazy_init and what calls it).
RECORDER = '''
import torch
torch._fake_cuda_calls = []
def _rec(name, real):
    def f(*a, **k):
        torch._fake_cuda_calls.append(name)
        return real(*a, **k)
    return f
for _name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "set_device",
              "get_device_properties", "get_device_capability", "mem_get_info", "synchronize"):
    setattr(torch.cuda, _name, _rec(_name, getattr(torch.cuda, _name)))
'''


def fake_vllm(tmp_path: Path) -> Path:
    from train.gpucheck.fork import write_stand_in_vllm

    return write_stand_in_vllm(tmp_path / "fakes", cpu=False, engine_body=ENGINE_RECORDS)


def run_child(tmp_path: Path, body: str) -> dict:
    fakes = fake_vllm(tmp_path)
    record = tmp_path / "record.json"
    script = RECORDER + textwrap.dedent(body)
    env = {**os.environ, "PYTHONPATH": f"{fakes}{os.pathsep}{ROOT}", "FAKE_VLLM_RECORD": str(record),
           "HF_HUB_OFFLINE": "1"}
    env.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 17, r.stderr[-3000:]
    return json.loads(record.read_text())


def test_no_cuda_initialisation_before_the_vllm_engine_is_built(tmp_path, tiny_model_dir, bm25_index_dir):
    """The evaluator (the parent counts GPUs, then builds its one engine in-process) and infer.py."""
    rec = run_child(tmp_path / "eval", f"""
        from train import evaluate
        from train.evaluation import options as eval_options, results as eval_results, runner as eval_runner
        opts = eval_options.EvalOptions.parse(["--model", {str(tiny_model_dir)!r}, "--data", "x",
                                              "--backend", "vllm", "--method", "direct"])
        eval_runner.run_model(opts, opts.ask.model, [], __import__("pathlib").Path({str(tmp_path / 'o.jsonl')!r}))
    """)
    assert rec["cuda_calls"] == [], f"CUDA touched before the engine was built: {rec['cuda_calls']}"
    assert rec["start_method"] == "spawn"
    kw = rec["engine_args"]
    # vLLM's defaults for from_engine_args (ENGINE_CONTEXT) would be 128 sequences and 2,048 tokens
    assert (kw["max_num_seqs"], kw["max_num_batched_tokens"], kw["gpu_memory_utilization"]) == (256, 16384, 0.85)
    assert kw["enforce_eager"] is False and kw["enable_prefix_caching"] is True

    rec = run_child(tmp_path / "infer", f"""
        from train import infer
        infer.main(["who wrote hamlet", "--model", {str(tiny_model_dir)!r}, "--backend", "vllm",
                    "--index", {str(bm25_index_dir)!r}, "--max-num-seqs", "64", "--max-num-batched-tokens", "4096",
                    "--gpu-memory-utilization", "0.7"])
    """)
    assert rec["cuda_calls"] == [] and rec["start_method"] == "spawn"
    kw = rec["engine_args"]
    assert (kw["max_num_seqs"], kw["max_num_batched_tokens"], kw["gpu_memory_utilization"]) == (64, 4096, 0.7)


def test_engine_flags_are_checked(capsys):
    from train import evaluate

    for bad in (["--gpu-memory-utilization", "1.5"], ["--max-num-seqs", "0"], ["--max-num-batched-tokens", "0"]):
        with pytest.raises(SystemExit) as e:
            evaluate.main(["--model", "m", "--data", "x", *bad])
        assert e.value.code == 2 and bad[0] in capsys.readouterr().err
        with pytest.raises(SystemExit) as e:
            infer.main(["q", *bad])
        assert e.value.code == 2 and bad[0] in capsys.readouterr().err


def test_each_engine_spawns_and_has_its_own_compile_cache(monkeypatch, tmp_path):
    from train.inference.backends import vllm_engine_env

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "c"))
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    a, b = vllm_engine_env(0), vllm_engine_env(1)
    assert a["VLLM_WORKER_MULTIPROC_METHOD"] == b["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert a["VLLM_CACHE_ROOT"] != b["VLLM_CACHE_ROOT"]
    assert all(Path(e["VLLM_CACHE_ROOT"]).parent == tmp_path / "c" for e in (a, b))
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "forkserver")  # the user's choice is kept
    assert vllm_engine_env()["VLLM_WORKER_MULTIPROC_METHOD"] == "forkserver"


# -- the hf engine's memory ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_engine_parts(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_model_dir))


def ask_many(engine, prompts: list[list[int]], max_tokens: list[int]) -> list:
    async def go():
        return await asyncio.gather(*(engine.generate(request_id=f"r{i}", prompt_ids=p,
                                                      sampling_params={"temperature": 0, "max_tokens": m})
                                      for i, (p, m) in enumerate(zip(prompts, max_tokens))))
    return asyncio.run(go())


def test_kept_caches_own_exactly_their_rows(tiny_engine_parts):
    """Rows that finish at different decode steps of one batch: each kept cache is a tensor of its own
    (a slice of the batch's cache would keep the whole rows x length tensor of every layer alive)."""
    from train.inference.hf_engine import HFBatchedServerManager

    model, tok = tiny_engine_parts
    eng = HFBatchedServerManager(model, tok, "cpu", 0, max_batch=8)
    prompts = [tok.encode("the capital of france is " * (i + 1)) for i in range(6)]
    ask_many(eng, prompts, [3, 5, 8, 4, 6, 7])
    assert len(eng.cache) == 6
    total = 0
    for rid, (tokens, kv) in eng.cache.items():
        for k, v in kv:
            for t in (k, v):
                own = t.numel() * t.element_size()
                assert t.shape[0] == 1 and t.shape[2] == len(tokens), (rid, t.shape, len(tokens))
                assert t.untyped_storage().nbytes() == own, \
                    f"{rid}: kept tensor {tuple(t.shape)} holds {t.untyped_storage().nbytes()} bytes of storage, " \
                    f"its own {own}"
                total += own
    assert eng.kept_bytes == total and eng.describe()["kept_bytes"] == total
    eng.close()


def test_kept_caches_are_bounded_in_bytes_and_dropped_when_a_trajectory_ends(tiny_engine_parts):
    from train.inference.hf_engine import HFBatchedServerManager

    model, tok = tiny_engine_parts
    probe = HFBatchedServerManager(model, tok, "cpu", 0)
    ask_many(probe, [tok.encode("one two three four five six")], [4])
    one = probe.kept_bytes
    probe.close()
    eng = HFBatchedServerManager(model, tok, "cpu", 0, max_cached_bytes=int(2.5 * one))
    ask_many(eng, [tok.encode("one two three four five six")] * 6, [4] * 6)
    assert 0 < eng.kept_bytes <= int(2.5 * one) and len(eng.cache) == 2 and eng.stats["evicted"] == 4
    kept = list(eng.cache)
    eng.release(kept[0])
    assert list(eng.cache) == kept[1:] and eng.kept_bytes == one
    eng.close()


def test_a_finished_trajectory_leaves_no_cache(tiny_engine_parts, bm25_index_dir, tiny_model_dir):
    """Through the asker and the very agent loop of training: searches, then ends (answer or turns)."""
    from train.inference.asker import Asker
    from train.inference.backends import make_search_client
    from train.inference.hf_engine import HFBatchedServerManager
    from train.inference.settings import AskSettings

    model, tok = tiny_engine_parts
    eng = HFBatchedServerManager(model, tok, "cpu", 0)
    client = make_search_client(index=str(bm25_index_dir))
    asker = Asker(eng, tok, client, AskSettings(model=str(tiny_model_dir), max_turns=2, max_new_tokens=12))

    async def go():
        return await asyncio.gather(*(asker.ask(q) for q in ("who wrote hamlet", "where is paris", "what is rome")))

    asyncio.run(go())
    assert eng.calls >= 3 and len(eng.cache) == 0 and eng.kept_bytes == 0 and eng.stats["released"] == 3
    eng.close()


def test_out_of_memory_is_retried_once_and_a_device_fault_kills_the_engine(tiny_engine_parts):
    from train.errors import EngineDead
    from train.inference.hf_engine import HFBatchedServerManager

    model, tok = tiny_engine_parts
    eng = HFBatchedServerManager(model, tok, "cpu", 0)
    real = eng._forward
    fails = {"oom": 1}

    def flaky(*a, **k):
        if fails["oom"]:
            fails["oom"] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(*a, **k)

    eng._forward = flaky
    ask_many(eng, [tok.encode("warm up")], [2])  # leaves a kept cache
    fails["oom"] = 1
    out = ask_many(eng, [tok.encode("one two"), tok.encode("three four five")], [3, 3])
    assert [len(o.token_ids) for o in out] == [3, 3] and eng.stats["oom_retries"] >= 1
    eng.close()

    eng = HFBatchedServerManager(model, tok, "cpu", 0)

    def broken(*a, **k):
        raise torch.AcceleratorError("CUDA error: unspecified launch failure (simulated)")

    eng._forward = broken
    with pytest.raises(EngineDead, match="unspecified launch failure"):
        ask_many(eng, [tok.encode("one")], [2])
    with pytest.raises(EngineDead):  # and every later request
        ask_many(eng, [tok.encode("two")], [2])
    eng.close()


# -- infer.py --file: each answer written as it finishes; a rerun asks only the rest -------------------


class AnswerOrDie:
    """Answers ``<answer> q </answer>`` at once; raises ``die`` for the questions named."""

    def __init__(self, tokenizer, die=(), error=RuntimeError):
        self.tokenizer, self.die, self.error, self.asked = tokenizer, set(die), error, []

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kw):
        text = self.tokenizer.decode(prompt_ids)
        q = text.split("Question: ", 1)[1].split("?", 1)[0]
        self.asked.append(q)
        if q in self.die:
            await asyncio.sleep(0.2)  # the others finish first
            raise self.error(f"died on {q}")
        return TokenOutput(token_ids=self.tokenizer.encode(f"<answer> {q} </answer>", add_special_tokens=False))


def test_infer_file_writes_each_answer_and_resumes(tiny_tokenizer, bm25_index_dir, tmp_path, capsys):
    from train.errors import EngineDead

    rows = [{"id": str(i), "question": f"q{i}", "golden_answers": [f"q{i}"]} for i in range(6)]
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "a.jsonl"
    argv = ["--file", str(f), "--out", str(out), "--index", str(bm25_index_dir), "--max-turns", "1"]
    gen = AnswerOrDie(tiny_tokenizer, die={"q4"}, error=EngineDead)
    assert infer.main(argv, generator=gen) == 4  # the engine died: the answers so far are kept
    assert "answers written so far are kept" in capsys.readouterr().err
    kept = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(kept) == ["0", "1", "2", "3", "5"]
    with open(out, "a") as fh:
        fh.write('{"id": "4", "quest')  # a line cut by a kill
    gen2 = AnswerOrDie(tiny_tokenizer)
    assert infer.main(argv, generator=gen2) == 0
    assert gen2.asked == ["q4"]  # only the question not answered yet
    printed = capsys.readouterr()
    assert "resuming: 5 of 6" in printed.err and "6 of 6 answers" in printed.out and "EM 1.000" in printed.out
    final = [json.loads(line) for line in out.read_text().splitlines()]
    assert [d["id"] for d in final] == [str(i) for i in range(6)] and all(d["em"] == 1.0 for d in final)
    # another file's answers under the same ids are refused, not mixed in
    f.write_text("".join(json.dumps({**r, "question": "other " + r["question"]}) + "\n" for r in rows))
    from tests.conftest import refuses

    refuses(lambda a: infer.main(a, generator=gen2), argv, capsys,
            "holds results for other data: 6 rows .e.g. id .0.. have a different question", code=2)


def test_evaluator_with_one_dead_engine_keeps_its_rows(tiny_tokenizer, tmp_path, qa_path, capsys):
    from train import evaluate
    from train.data_prep import main as prep
    from train.errors import EngineDead
    from train.evaluation import results as eval_results

    prep(["--out", str(tmp_path / "data"), "--local", str(qa_path), "--holdout", "10"])
    data = tmp_path / "data" / "test.parquet"
    rows = eval_results.load_rows(str(data), None, None)
    out = tmp_path / "e.jsonl"
    victim = rows[5]["question"].rstrip("?")
    gen = AnswerOrDie(tiny_tokenizer, die={victim}, error=EngineDead)
    rc = evaluate.main(["--model", "scripted", "--data", str(data), "--out", str(out), "--method", "direct",
                        "--concurrency", "4"], generator=gen)
    assert rc == 4, capsys.readouterr().err
    assert "rerun the same command" in capsys.readouterr().err
    assert 0 < len(out.read_text().splitlines()) < len(rows)
