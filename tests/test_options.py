"""Parsing of ddpbench's options (pure functions) and their errors."""

import argparse

import pytest

from ddpbench import options


@pytest.mark.parametrize("text,expected", [
    ("1MB", 1024**2), ("10mb", 10 * 1024**2), ("1GB", 1024**3), ("64KB", 65536),
    ("512", 512), ("512B", 512), (" 2 MB ", 2 * 1024**2), ("3M", 3 * 1024**2),
])
def test_sizes_use_powers_of_1024(text, expected):
    assert options.parse_size(text) == expected


@pytest.mark.parametrize("text", ["abc", "1.5MB", "-1MB", "0MB", "10TB", ""])
def test_bad_sizes_are_rejected_with_an_example(text):
    with pytest.raises(argparse.ArgumentTypeError, match="MB"):
        options.parse_size(text)


def test_size_lists_keep_order_and_drop_duplicates():
    assert options.parse_sizes("10MB,1MB,10MB") == [10 * 1024**2, 1024**2]
    with pytest.raises(argparse.ArgumentTypeError):
        options.parse_sizes(" , ")


@pytest.mark.parametrize("size", [1, 1536, 1024, 1024**2, 3 * 1024**2, 1024**3])
def test_format_size_round_trips(size):
    assert options.parse_size(options.format_size(size)) == size


def test_world_sizes():
    assert options.parse_world_sizes("2,4,6") == [2, 4, 6]
    for bad in ["0", "-2", "two", "2,,x", "", "65"]:
        with pytest.raises(argparse.ArgumentTypeError):
            options.parse_world_sizes(bad)


def test_backend_timeout_rounds():
    assert options.parse_backend("NCCL") == "nccl"
    with pytest.raises(argparse.ArgumentTypeError, match="gloo, nccl, auto"):
        options.parse_backend("mpi")
    assert options.parse_timeout("2.5") == 2.5
    for bad in ["-1", "0", "soon"]:
        with pytest.raises(argparse.ArgumentTypeError):
            options.parse_timeout(bad)
    assert options.parse_rounds("0") == 0
    with pytest.raises(argparse.ArgumentTypeError):
        options.parse_rounds("-3")


@pytest.mark.parametrize("text,expected", [("1%", 0.01), ("0.02", 0.02), ("0", 0.0), (" 5% ", 0.05)])
def test_precision_is_a_fraction_or_a_percentage(text, expected):
    assert options.parse_precision(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["abc", "-1%", "100%", "1.5"])
def test_bad_precisions_name_the_value(text):
    with pytest.raises(argparse.ArgumentTypeError, match="precision"):
        options.parse_precision(text)


def test_percentages_for_the_ab_threshold():
    assert options.parse_percent("5%") == pytest.approx(0.05)
    assert options.parse_percent("12.5") == pytest.approx(0.125)
    assert options.parse_percent("0", allow_zero=True) == 0.0
    for bad in ("0", "-3", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="percentage"):
            options.parse_percent(bad)


def test_a_memory_tolerance_is_written_as_every_threshold_is():
    # Before: "10" meant 1000% for the tolerance and 10% for the threshold.
    for text in ("10", "10%", " 10% "):
        assert options.parse_memory_tolerance(text) == pytest.approx(0.10) == options.parse_percent(text)
    assert options.parse_memory_tolerance("0") == 0.0
    # A bare number below 1 reads as a fraction too: refused, naming both spellings.
    for parse in (options.parse_memory_tolerance, options.parse_percent, options.parse_percent_or_zero):
        with pytest.raises(argparse.ArgumentTypeError, match=r"'0.1' is ambiguous.*write the percent sign: 0.1% or 10%"):
            parse("0.1")
    assert options.parse_percent("0.5%") == pytest.approx(0.005)


@pytest.mark.parametrize("argv", [["--threshold", "10"], ["--memory-tolerance", "10"]])
def test_compare_reads_a_bare_ten_as_ten_percent_in_both_options(argv):
    from ddpbench.commands import compare

    parser = argparse.ArgumentParser()
    compare.add_parser(parser.add_subparsers())
    args = parser.parse_args(["compare", *argv])
    assert getattr(args, argv[0][2:].replace("-", "_")) == pytest.approx(0.10)


SECONDS_OPTIONS = ["--dist-timeout", "--dist-controller-wait", "--dist-max-time", "--dist-ab-max-time",
                   "--dist-ab-block-time", "--dist-ab-run-budget"]


@pytest.mark.parametrize("option", SECONDS_OPTIONS)
@pytest.mark.parametrize("value,message", [
    ("nan", "is not a finite number of seconds"), ("inf", "is not a finite number of seconds"),
    ("-inf", "is not a finite number of seconds"), ("1e9", "is not a plan this option supports"),
    ("0", "must be larger than 0"),
])
def test_every_seconds_option_refuses_nan_inf_and_absurd_values(pytester, option, value, message):
    result = pytester.runpytest_subprocess(f"{option}={value}", "-p", "no:cacheprovider", timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option}*{value!r}*{message}*"])


def test_counts_and_fractions_refuse_nan_inf_and_absurd_values():
    for parse, bad in [(options.parse_rounds, ["nan", "1e3", "10000000"]),
                       (options.parse_warmup, ["inf", "99999999"]),
                       (options.parse_pools_per_side, ["nan", "17"]),
                       (options.parse_precision, ["nan", "inf"]),
                       (options.parse_percent, ["nan", "inf", "1e9"]),
                       (options.parse_seed, ["nan", "-1", "4294967296", "1.5"])]:
        for text in bad:
            with pytest.raises(argparse.ArgumentTypeError):
                parse(text)
    assert options.parse_pools_per_side("16") == 16 and options.parse_seed("4294967295") == 2**32 - 1


@pytest.mark.pool
def test_the_workers_seconds_option_refuses_nan_too():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ddpbench.worker", "--controller", "127.0.0.1:1",
                          "--connect-timeout", "nan"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "'nan' is not a finite number of seconds" in out.stderr
    assert "Traceback" not in out.stderr
