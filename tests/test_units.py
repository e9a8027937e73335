"""units.parse_size / format_bytes / format_count against hand-written values."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partrain_edu.units import MAX_SIZE, format_bytes, format_count, parse_size


@pytest.mark.parametrize("text, expected", [
    ("7.5e9", 7_500_000_000),
    ("7.5B", 7_500_000_000),
    ("350M", 350_000_000),
    ("13b", 13_000_000_000),
    ("1.5T", 1_500_000_000_000),
    ("2K", 2_000),
    ("80GB", 80_000_000_000),
    ("80 GiB", 80 * 1024**3),
    ("80gib", 85_899_345_920),
    ("1.3B", 1_300_000_000),          # exact: 1.3 * 1e9 in floats is 1300000000.0000002
    ("  42 ", 42),
    ("512MiB", 512 * 2**20),
    ("1.5KB", 1_500),
    (".5M", 500_000),
    (8, 8),
    (7.5e9, 7_500_000_000),
])
def test_parse_size_examples(text, expected):
    assert parse_size(text) == expected
    assert isinstance(parse_size(text), int)


@pytest.mark.parametrize("bad", ["abc", "", "GB", "7.5X", "7.5 B B", "-5", "0", "0GB", "-1.5B", "1e-9",
                                 "nan", "inf", 0, -3, float("nan"), float("inf"), True, None, [8]])
def test_parse_size_rejects_with_one_line_naming_the_fix(bad):
    with pytest.raises(ValueError) as err:
        parse_size(bad)
    message = str(err.value)
    assert "\n" not in message
    assert "7.5B" in message  # says what to write instead


@given(st.integers(min_value=1, max_value=10**15))
def test_parse_size_round_trips_integers(n):
    assert parse_size(str(n)) == n
    assert parse_size(f"{n}K") == n * 1000
    if n * 2**30 <= MAX_SIZE:
        assert parse_size(f"{n} GiB") == n * 2**30


@pytest.mark.parametrize("text", ["1e18", "1000PB", "1e6T", 10**18, 1e18])
def test_parse_size_accepts_the_limit(text):
    assert parse_size(text) == MAX_SIZE == 10**18


@pytest.mark.parametrize("big", ["1e400", "9e99999", "1.0000000000000000001e18", "1001PB", "931322575GiB", "1e19",
                                 10**18 + 1, 1e300])
def test_parse_size_refuses_sizes_beyond_the_limit_in_one_line(big):
    """Sizes beyond float range used to crash the tables (decimal.InvalidOperation, OverflowError)."""
    with pytest.raises(ValueError, match="above the limit of 1e18") as err:
        parse_size(big)
    assert "\n" not in str(err.value) and "7.5B" in str(err.value)


def test_parse_size_refuses_exponents_decimal_cannot_hold():
    with pytest.raises(ValueError, match="cannot read"):
        parse_size("1e99999999999999999999")
    with pytest.raises(ValueError, match="rounds to 0"):
        parse_size("1e-99999999")


@pytest.mark.parametrize("n, text", [
    (120_000_000_000, "120.0 GB"),
    (31_406_250_000, "31.4 GB"),
    (16_640_625_000, "16.6 GB"),
    (1_875_000_000, "1.9 GB"),        # half rounds up, as the ZeRO paper prints it
    (999_960_000, "1.0 GB"),          # not "1000.0 MB"
    (2_800_000_000_000, "2.8 TB"),
    (1_500, "1.5 KB"),
    (512, "512 B"),
    (0, "0 B"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("n, text", [
    (7_500_000_000, "7.5B"), (175_000_000_000, "175B"), (1_652_230_656, "1.65B"),
    (350_000_000, "350M"), (1_008_038_758_400, "1.01T"), (2_000, "2K"), (12, "12"),
])
def test_format_count(n, text):
    assert format_count(n) == text


def test_formatting_never_fails_on_huge_numbers():
    """The default Decimal context (28 digits) made quantize fail from about 1e43 B."""
    assert format_bytes(10**50) == f"{10**35}.0 PB"
    assert format_count(10**50) == f"{10**38}T"


@given(st.integers(min_value=1000, max_value=10**17))
def test_format_bytes_stays_below_1000_units(n):
    value, unit = format_bytes(n).split()
    assert unit in ("KB", "MB", "GB", "TB", "PB")
    assert 1 <= float(value) < 1000 or unit == "PB"
    scale = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "PB": 1e15}[unit]
    assert math.isclose(float(value) * scale, n, rel_tol=0.06)
