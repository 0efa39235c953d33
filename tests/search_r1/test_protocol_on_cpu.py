from pathlib import Path

import pytest

from train.search_r1 import prompts
from train.search_r1 import protocol as P

#: the real Qwen2.5 tokenizer, bundled with the tests (tests/data/README.md)
QWEN_TOKENIZER = Path(__file__).resolve().parents[1] / "data" / "qwen2.5_tokenizer"


def test_prompt_is_search_r1_text():
    p = prompts.make_prompt("  who wrote hamlet ")
    assert p.startswith("Answer the given question. You must conduct reasoning inside <think> and </think> first")
    assert p.endswith("For example, <answer> Beijing </answer>. Question: who wrote hamlet?\n")
    assert prompts.make_prompt("Is it?").endswith("Question: Is it?\n")
    assert prompts.make_messages("q") == [{"role": "user", "content": prompts.make_prompt("q")}]
    with pytest.raises(ValueError):
        prompts.make_prompt("   ")


@pytest.mark.parametrize("text,kind,content", [
    ("<think>x</think> <search> capital of France </search>", "search", "capital of France"),
    ("<search>a</search><search>b</search>", "search", "a"),  # first stop tag wins
    ("<think>I know</think><answer> Paris </answer>", "answer", "Paris"),
    ("<search>x</search> then <answer>y</answer>", "search", "x"),
    ("<search> old <search> new </search>", "search", "new"),  # last opening tag before the stop
    ("<answer></answer>", "answer", ""),
    ("no tags at all", "invalid", ""),
    ("stray </search>", "invalid", ""),
    ("<search>   </search>", "invalid", ""),
    ("<search> unfinished", "invalid", ""),
])
def test_parse_turn(text, kind, content):
    assert P.parse_turn(text) == P.Action(kind, content)


def test_the_turns_a_warm_start_teaches_parse_back():
    turn = P.search_turn("who wrote hamlet", "I need to search.")
    assert turn == "<think> I need to search. </think><search> who wrote hamlet </search>"
    assert P.parse_turn(turn) == P.Action("search", "who wrote hamlet")
    answer = P.answer_turn("William Shakespeare", "I found it.")
    assert P.parse_turn(answer) == P.Action("answer", "William Shakespeare")
    assert P.is_valid_sequence(turn + P.format_observation(["Hamlet\nA play."]) + answer)


def test_truncate_at_stop():
    assert P.truncate_at_stop("a <search> q </search> junk <answer>x</answer>") == "a <search> q </search>"
    assert P.truncate_at_stop("nothing") == "nothing"


def test_observation_format_and_truncation():
    docs = ['"Paris"\nParis is the capital.', '"Lyon"\nLyon is a city.']
    obs = P.format_observation(docs)
    assert obs == ('\n\n<information>Doc 1(Title: "Paris") Paris is the capital.\n'
                   'Doc 2(Title: "Lyon") Lyon is a city.</information>\n\n')
    count = len  # characters as "tokens"
    short = P.format_observation(docs, max_tokens=len(obs) - 1, count_tokens=count)
    assert short == '\n\n<information>Doc 1(Title: "Paris") Paris is the capital.</information>\n\n'
    tiny = P.format_observation(docs, max_tokens=50, count_tokens=count)
    assert tiny.endswith("</information>\n\n") and len(tiny) <= 50 and "Doc 1" in tiny
    empty = P.format_observation(docs, max_tokens=10, count_tokens=count)
    assert empty == "\n\n<information></information>\n\n"


def test_extract_answer_ignores_observations_and_invalid_message():
    r = ("<think>a</think><search>q</search>\n\n<information>Doc 1(Title: x) <answer> fake </answer>"
         "</information>\n\n<answer> real </answer>")
    assert P.extract_answer(r) == "real"
    assert P.extract_answer("<answer>a</answer> x <answer> b </answer>") == "b"
    assert P.extract_answer("<answer> unclosed") is None
    assert P.extract_answer("<answer> I need </think><answer> x </answer>") == "x"  # same reading as parse_turn
    assert P.parse_turn("<answer> I need </think><answer> x </answer>").content == "x"
    assert P.extract_answer("<information><answer>x</answer></information>") is None
    assert P.extract_answer("x" + P.INVALID_ACTION_MESSAGE) is None
    assert P.extract_answer("<information><answer>x</answer>") is None  # unclosed observation
    s = "pre <answer>y</answer>"
    a, b = P.answer_span(s)
    assert s[a:b] == "<answer>y</answer>"


def test_count_searches_and_valid_sequence():
    good = ("<think>a</think><search>q</search>\n\n<information>d</information>\n\n"
            "<think>b</think><answer>x</answer>")
    assert P.count_searches(good) == 1
    assert P.is_valid_sequence(good)
    assert P.is_valid_sequence("<think>a</think> <answer>x</answer>")
    assert not P.is_valid_sequence("<answer>x</answer>")
    assert not P.is_valid_sequence("<think>a</think> junk <answer>x</answer>")
    assert not P.is_valid_sequence("<think>a</think><answer>x</answer> after")
    assert not P.is_valid_sequence("<think>a</think>" + P.INVALID_ACTION_MESSAGE + "<answer>x</answer>")


def test_tags_under_the_real_qwen_tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    assert (len(tok), tok.vocab_size) == (151665, 151643)
    text = "<think>x</think>\n<search> capital of France </search>"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert P.parse_turn(tok.decode(ids)).content == "capital of France"
    # The chat-templated prompt round-trips and ends with the assistant header.
    prompt = prompts.render_prompt(tok, "who wrote hamlet")
    assert prompt.endswith("<|im_start|>assistant\n") and "Question: who wrote hamlet?" in prompt


def test_an_answer_does_not_span_an_observation():
    """<answer> in one turn and </answer> after the invalid-action message is no answer (the agent
    loop's per-turn parse agrees); infer.py showed the message as part of the answer before."""
    from train.search_r1 import protocol as P

    r = "<think>x</think><answer> The Film </search>" + P.INVALID_ACTION_MESSAGE + "</answer>"
    assert P.extract_answer(r) is None and P.answer_span(r) is None
    r += "<answer> right </answer>"
    assert P.extract_answer(r) == "right"


def test_tagged_spans_cut_and_rejoin():
    text = "a <think> x </think>\n<search> q </search> b <answer> y </answer><information>z</information> c"
    spans = P.tagged_spans(text)
    assert "".join(p for _, p in spans) == text
    assert [k for k, _ in spans] == [None, "think", None, "search", None, "answer", "information", None]
    assert P.tagged_spans("<search> unclosed") == [(None, "<search> unclosed")]


def test_only_the_protocol_module_spells_the_tags():
    """The tags live in train/search_r1/protocol.py; code elsewhere uses its constants (infer.py coloured
    the tags with regexes of its own). Comments and docstrings may name them; string constants may not."""
    import ast

    root = Path(__file__).resolve().parents[2]
    tags = ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>")
    # settings.py: the docs table's words; toy/: the scripted outputs a toy policy is taught (model text)
    allowed = {"train/search_r1/protocol.py", "train/settings.py", "train/toy/learnable_task.py",
               "train/toy/tiny_model.py"}
    bad = []
    for path in [root / "infer.py", *sorted((root / "train").rglob("*.py")),
                 *sorted((root / "retrieval").rglob("*.py"))]:
        rel = str(path.relative_to(root))
        if rel in allowed:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                    and any(t in node.value for t in tags):
                bad.append(f"{rel}:{node.lineno}: {node.value[:60]!r}")
    assert not bad, "tags spelled outside the protocol module:\n" + "\n".join(bad)
