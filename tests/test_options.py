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
