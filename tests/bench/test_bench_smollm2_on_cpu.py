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
    os.utime(model / "model.safetensors", ns=(1, 1))  # the same weights written again (a re-merge): reused
    b.evaluate(str(model), "search_r1", "hf", out)
    assert (len(commands), rows()) == (2, 2)
    (model / "model.safetensors").write_bytes(b"trained")  # another checkpoint at the same path
    b.evaluate(str(model), "search_r1", "hf", out)
    assert (len(commands), rows()) == (3, 1)  # started over
    b.evaluate(str(model), "search_r1", "hf", out, limit=5)
    assert (len(commands), rows()) == (4, 1)  # another command: started over


def test_the_held_out_part_starts_from_an_empty_output_folder(tmp_path, monkeypatch):
    """A fresh clone's `python bench/bench_smollm2.py` reached the held-out part with no runs/smollm2/heldout/
    folder and died writing its first stamp there. The evaluator is faked (it writes its rows and its log where
    the real one does, making no folder); the folders, stamps and tables are the bench's own."""
    import json

    import train.models.registry as registry

    model = tmp_path / "converted"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setattr(registry, "resolve", lambda name, *a, **k: str(model) if name == bench.MODEL else name)
    asked = []

    def fake_run(cmd, log):
        out = cmd[cmd.index("--out") + 1]
        asked.append((cmd[cmd.index("--model") + 1], cmd[cmd.index("--backend") + 1], out))
        with open(out, "a") as f:  # no mkdir: the folder must be there already, as for train.evaluate
            for i, (source, em) in enumerate((("nq", 1.0), ("hotpotqa", 0.0))):
                f.write(json.dumps({"uid": f"q{i}", "em": em, "f1": em, "data_source": source, "searches": 1,
                                    "answer": "a", "trajectory": "t", "generated_tokens": 3}) + "\n")
        with open(log, "w") as f:
            f.write("2 questions in 1.0 s on 1 engine: 2.0 questions/s, 6.0 generated tokens/s\n")
        return 1.0

    monkeypatch.setattr(bench, "run", fake_run)
    out = tmp_path / "fresh" / "smollm2"
    assert not out.exists()
    assert bench.main(["--parts", "heldout", "--out", str(out), "--index", str(tmp_path / "idx")]) == 0
    held = out / "heldout"
    assert sorted(p.name for p in held.glob("*.stamp")) == ["untrained.stamp", "warm_start.stamp",
                                                           "warm_start_hf.stamp"]
    assert [(m, b) for m, b, _ in asked] == [(bench.MODEL, "vllm"), (str(out / "sft"), "vllm"),
                                             (str(out / "sft"), "hf")]
    results = json.loads((out / "results.json").read_text())
    assert results["heldout"]["untrained"]["em"] == 0.5 and "heldout" in results["seconds"]
    assert bench.main(["--parts", "heldout", "--out", str(out), "--index", str(tmp_path / "idx")]) == 0
    assert len(asked) == 3  # a second run reuses every evaluation


def test_the_usage_line_states_the_defaults():
    """The usage line of the docstring shows --steps and --save-freq with their default values."""
    import re

    parser_defaults = {a.dest: a.default for a in _parser()._actions}
    for flag in ("steps", "save_freq"):
        shown = re.search(rf"\[--{flag.replace('_', '-')} (\d+)\]", bench.__doc__)
        assert shown and int(shown.group(1)) == parser_defaults[flag], flag


def _parser():
    """bench_smollm2's argument parser, caught as main builds it (main is not run past parse_args)."""
    import argparse

    caught = {}

    class Stop(Exception):
        pass

    def parse(self, argv=None, namespace=None):
        caught["parser"] = self
        raise Stop

    orig = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = parse
    try:
        bench.main([])
    except Stop:
        pass
    finally:
        argparse.ArgumentParser.parse_args = orig
    return caught["parser"]
