import pytest

from train.search_r1.reward import compute_score, em, f1, gold_answers, sub_em


def s(text, gt, **kw):
    return compute_score("nq", text, gt, **kw)


def test_em_normalisation():
    assert s("<answer> The Eiffel Tower! </answer>", ["eiffel tower"])["score"] == 1.0
    assert s("<answer>an apple</answer>", "Apple")["score"] == 1.0
    assert s("<answer>apples</answer>", "Apple")["score"] == 0.0
    assert s("<answer>Eiffel-Tower</answer>", ["eiffel tower"])["score"] == 0.0  # hyphen dropped, not spaced
    assert s("<answer>  1,000  </answer>", ["1000"])["score"] == 1.0
    assert s("<answer>Zürich</answer>", {"target": ["zürich"]})["score"] == 1.0


def test_many_golds_last_answer_unclosed_and_observation():
    assert s("<answer>x</answer>", {"target": ["y", "X"]})["score"] == 1.0
    assert s("<answer>Paris</answer> <answer>Lyon</answer>", ["Paris"])["score"] == 0.0
    assert s("<answer>Paris</answer> <answer>Lyon", ["Paris"])["score"] == 1.0
    r = s("<search>q</search>\n\n<information><answer>Paris</answer></information>\n\n", ["Paris"])
    assert r["score"] == 0.0 and r["has_answer"] == 0.0 and r["num_searches"] == 1.0
    assert s("<answer></answer>", ["Paris"])["score"] == 0.0
    assert s("<answer>42</answer>", ["42"])["score"] == 1.0


def test_variants_hand_worked():
    r = s("<answer>the big red dog</answer>", ["red dog"])
    assert r["em"] == 0.0 and r["sub_em"] == 1.0
    # pred tokens [big, red, dog], gold [red, dog]: P = 2/3, R = 1 -> F1 = 0.8
    assert r["f1"] == pytest.approx(0.8)
    assert s("<answer>the big red dog</answer>", ["red dog"], metric="f1")["score"] == pytest.approx(0.8)
    assert s("<answer>the big red dog</answer>", ["red dog"], metric="sub_em")["score"] == 1.0
    assert f1("a b", ["c"]) == 0.0 and em("x", ["y"]) == 0.0 and sub_em("x", [""]) == 0.0


def test_format_reward_table():
    valid_ok = "<think>a</think><answer>Paris</answer>"
    valid_wrong = "<think>a</think><answer>Lyon</answer>"
    invalid_ok = "<answer>Paris</answer>"
    invalid_wrong = "<answer>Lyon</answer>"
    kw = dict(format_score=True)
    assert s(valid_ok, ["Paris"], **kw)["score"] == 1.0
    assert s(invalid_ok, ["Paris"], **kw)["score"] == pytest.approx(0.8)
    assert s(valid_wrong, ["Paris"], **kw)["score"] == pytest.approx(0.2)
    assert s(invalid_wrong, ["Paris"], **kw)["score"] == pytest.approx(0.1)
    assert s("nothing", ["Paris"], **kw)["score"] == 0.0
    retrieved = ("<think>a</think><search>q</search>\n\n<information>Paris is big</information>\n\n"
                 "<think>b</think><answer>Lyon</answer>")
    assert s(retrieved, ["Paris"], retrieval_score=0.1, **kw)["score"] == pytest.approx(0.3)


def test_bad_ground_truth_and_metric():
    with pytest.raises(ValueError, match="target"):
        s("<answer>x</answer>", {"answers": ["x"]})
    with pytest.raises(ValueError, match="non-empty"):
        s("<answer>x</answer>", [])
    with pytest.raises(ValueError, match="metric"):
        s("<answer>x</answer>", "x", metric="bleu")
    import numpy as np
    assert gold_answers(np.array(["a", "b"])) == ["a", "b"]
    assert compute_score("my_custom_source", "<answer>x</answer>", "x")["score"] == 1.0
