"""Reading and writing sizes: parameter counts and bytes.

    >>> parse_size("7.5B"), parse_size("350M"), parse_size("80GB"), parse_size("80 GiB")
    (7500000000, 350000000, 80000000000, 85899345920)
    >>> format_bytes(120_000_000_000), format_count(7_500_000_000)
    ('120.0 GB', '7.5B')

Suffixes (case-insensitive):

- counts: ``K`` = 1e3, ``M`` = 1e6, ``B`` = 1e9 (billion, as in "a 7.5B model"), ``T`` = 1e12;
- decimal bytes: ``KB MB GB TB PB`` = 1e3 … 1e15 (how GPU vendors quote memory: an "80 GB" H100);
- binary bytes: ``KiB MiB GiB TiB`` = 2**10 … 2**40.

So ``"80B"`` is eighty *billion*, not eighty bytes. Every size is a positive whole number up to ``MAX_SIZE``
(1e18); a fractional result (``"1.1 GiB"``) is rounded to the nearest integer. Arithmetic is done in
:class:`~decimal.Decimal`, so ``"1.3B"`` is exactly 1_300_000_000 (in floats 1.3 * 1e9 is 1300000000.0000002).

Bad input raises ``ValueError`` with one line that says what to write instead; the command line prints it as
``partrain-edu <cmd>: error: <message>`` and exits 2.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation, localcontext

_MULTIPLIERS = {
    "": 1,
    "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12,                       # counts
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,     # decimal bytes
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,                # binary bytes
}
_NUMBER_AND_SUFFIX = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)$")
_BYTE_UNITS = (("B", 1), ("KB", 10**3), ("MB", 10**6), ("GB", 10**9), ("TB", 10**12), ("PB", 10**15))
_HINT = "write a positive number such as 7.5e9, 7.5B, 350M, 80GB or 80GiB"
# A million T parameters, or 1000 PB: far beyond any model or device. Bigger input is a typo, and capping it
# keeps every estimate built on it inside float range and exact in the formatters below.
MAX_SIZE = 10**18


def parse_size(text: str | int | float) -> int:
    """Return ``text`` as a positive int: ``"7.5e9"``, ``"7.5B"``, ``"350M"``, ``"2K"``, ``"80GB"``, ``"80 GiB"``.

    Raises ValueError for text that is not a size, and for sizes that are zero, negative or above MAX_SIZE.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"cannot read {text!r} as a size; {_HINT}")
    if isinstance(text, str):
        match = _NUMBER_AND_SUFFIX.match(text.strip())
        suffix = match.group(2).lower() if match else None
        if match is None or suffix not in _MULTIPLIERS:
            raise ValueError(f"cannot read {text!r} as a size; {_HINT}")
        try:
            number, scale = Decimal(match.group(1)), _MULTIPLIERS[suffix]   # exact: no context, no rounding
        except InvalidOperation:   # an exponent beyond what Decimal can hold at all, such as 1e99999999999999999999
            raise ValueError(f"cannot read {text!r} as a size; {_HINT}") from None
    else:
        if isinstance(text, float) and not math.isfinite(text):
            raise ValueError(f"cannot read {text!r} as a size; {_HINT}")
        number, scale = Decimal(text), 1
    if number <= 0:
        raise ValueError(f"size must be positive, got {text!r}; {_HINT}")
    # Look at the exponent before multiplying: "9e99999999" ("1e-99999999") would overflow (underflow)
    # Decimal's arithmetic context. Below 1e-20 even the largest suffix (2**40) leaves less than one.
    if number.adjusted() > 18 or (number.adjusted() >= -20 and number * scale > MAX_SIZE):
        raise ValueError(f"size {text!r} is above the limit of 1e18 (a million T parameters, or 1000 PB); "
                         "write a realistic size such as 7.5B, 175B or 80GB")
    if number.adjusted() < -20 or number * scale < Decimal("0.5"):
        raise ValueError(f"size {text!r} rounds to 0; {_HINT}")
    return int((number * scale).to_integral_value(rounding=ROUND_HALF_UP))


def _round(value: Decimal, step: str) -> Decimal:
    # Round half up, as people (and the ZeRO paper's "1.9 GB" for 1.875e9 B) do; float formatting
    # rounds ties to even and would print 1.875 as "1.8". The context holds every digit: the default 28
    # would make quantize fail from about 1e43 B (a notebook may pass any int).
    with localcontext(prec=max(28, value.adjusted() + 10)):
        return value.quantize(Decimal(step), rounding=ROUND_HALF_UP)


def _one_decimal(value: Decimal) -> str:
    return str(_round(value, "0.1"))


def format_bytes(n: int | float) -> str:
    """Bytes in decimal units with one decimal: ``120.0 GB``, ``31.4 GB``, ``1.9 GB``, ``512 B``."""
    n = Decimal(n)
    if abs(n) < 1000:
        return f"{n.to_integral_value(rounding=ROUND_HALF_UP)} B"
    i = max(k for k, (_, scale) in enumerate(_BYTE_UNITS) if abs(n) >= scale)
    text = _one_decimal(n / _BYTE_UNITS[i][1])
    if abs(Decimal(text)) >= 1000 and i + 1 < len(_BYTE_UNITS):  # 999.96 MB prints as 1.0 GB
        i += 1
        text = _one_decimal(n / _BYTE_UNITS[i][1])
    return f"{text} {_BYTE_UNITS[i][0]}"


def format_count(n: int | float) -> str:
    """A count with a K/M/B/T suffix and at most two decimals: ``7.5B``, ``175B``, ``1.65B``, ``350M``."""
    n = Decimal(n)
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if abs(n) >= scale:
            text = str(_round(n / scale, "0.01"))
            return text.rstrip("0").rstrip(".") + suffix
    return str(n.to_integral_value(rounding=ROUND_HALF_UP))
