"""Comma-separated flags (engine/cli.py comma_list: the one parser of every list flag): their values and
defaults parsed once, and a bad item argparse's usage error (exit 2) naming the flag and the item, never a
traceback. Parsed only: no model is loaded."""

import argparse

import pytest

import engine.bench
import server.bench
from engine.cli import comma_list
from ui.compare import coverage


def test_items_are_converted_blanks_dropped_and_a_bad_one_named():
    assert comma_list(int, 1)(" 1, 4,,8 ,") == [1, 4, 8]
    assert comma_list(float)("0.5,2") == [0.5, 2.0]
    assert comma_list()("int8wo, nf4") == ["int8wo", "nf4"] and comma_list()("") == []
    with pytest.raises(argparse.ArgumentTypeError, match="'x' is not a whole number"):
        comma_list(int)("1,x")
    with pytest.raises(argparse.ArgumentTypeError, match="0 is below 1"):
        comma_list(int, 1)("2,0")


def _usage_error(capsys, parse) -> str:
    with pytest.raises(SystemExit) as exc:
        parse()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("argv, flag, item", [
    (["gemv", "--rows", "1,x"], "--rows", "'x' is not a whole number"),
    (["verify", "--tokens", "1,0"], "--tokens", "0 is below 1"),
    (["prefill_chunks", "--chunks", "64,big"], "--chunks", "'big' is not a whole number"),
    (["bandwidth", "--variants", "int8wo", "--threads", "2", "--kv-dtypes", "int8"], None, None),
])
def test_a_benchs_list_flags_parse_or_fail_with_a_usage_error(capsys, argv, flag, item):
    def parse():
        p, _ = engine.bench.build_parser(argv)
        return p.parse_args(argv)

    if flag is None:  # a good command line: lists, not strings
        args = parse()
        assert args.variants == ["int8wo"] and args.kv_dtypes == ["int8"]
        return
    assert f"argument {flag}: {item}" in _usage_error(capsys, parse)


def test_defaults_go_through_the_same_parser():
    p, _ = engine.bench.build_parser(["gemv"])
    assert p.parse_args(["gemv"]).rows == [1, 4, 8, 32, 256, 1400]
    p, _ = engine.bench.build_parser(["bandwidth"])
    assert p.parse_args(["bandwidth"]).variants == []  # the bench's own default list then serves


def test_the_server_and_page_benches_use_it_too(capsys):
    def load():
        p, _ = server.bench.build_parser(["load", "--levels", "1,a"])
        return p.parse_args(["load", "--levels", "1,a"])

    assert "argument --levels: 'a' is not a whole number" in _usage_error(capsys, load)
    assert "argument --sizes: 'b' is not a whole number" in _usage_error(capsys, lambda: coverage.main(["--sizes", "3,b"]))
