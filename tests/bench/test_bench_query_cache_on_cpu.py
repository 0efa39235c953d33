"""bench/bench_query_cache.py: the stream it replays has the repeated share it says, and bad flags are refused."""

import pytest

from bench.bench_query_cache import main, stream


def test_stream_repeats_the_asked_share_of_each_questions_samples():
    none, some = stream(4, 5, 0.0), stream(4, 5, 0.4)
    assert len(none) == len(some) == 20 and len(set(none)) == 20
    assert len(set(some)) == 12  # per question: the text 3 times (2 repeats), 2 wordings of their own
    assert some[:3] == [some[0]] * 3 and some[3] != some[0]
    assert len(set(stream(4, 5, 1.0))) == 4


@pytest.mark.parametrize("argv, message", [(["--shares", "120"], "percentages from 0 to 100"),
                                           (["--clients", "0"], "must be >= 1")])
def test_bad_flags_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
