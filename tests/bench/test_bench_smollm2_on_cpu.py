"""bench/bench_smollm2.py's evaluations: reused when complete, resumed when interrupted, started over when
the command or the model's weights changed (its long runs themselves are not run here)."""

import os
import types

import bench.bench_smollm2 as bench


def test_an_evaluation_is_reused_resumed_or_redone(tmp_path, monkeypatch):
    commands = []

    def fake_run(cmd, log):  # what train.evaluate does to --out: append a row per question asked
        commands.append(cmd)
        with open(cmd[cmd.index("--out") + 1], "a") as f:
            f.write("row\n")
        return 1.0

    monkeypatch.setattr(bench, "run", fake_run)
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    b = bench.Bench(types.SimpleNamespace(out=str(tmp_path), vllm_python="python", index="idx"))
    out = tmp_path / "eval.jsonl"
    rows = lambda: out.read_text().count("row")  # noqa: E731

    b.evaluate(str(model), "search_r1", "hf", out)
    b.evaluate(str(model), "search_r1", "hf", out)
    assert (len(commands), rows()) == (1, 1)  # complete: reused
    out.with_suffix(".done").unlink()  # interrupted before it finished
    b.evaluate(str(model), "search_r1", "hf", out)
    assert (len(commands), rows()) == (2, 2)  # resumed: the rows already there are kept
    os.utime(model / "model.safetensors", ns=(1, 1))  # another checkpoint at the same path
    b.evaluate(str(model), "search_r1", "hf", out)
    assert (len(commands), rows()) == (3, 1)  # started over
    b.evaluate(str(model), "search_r1", "hf", out, limit=5)
    assert (len(commands), rows()) == (4, 1)  # another command: started over
