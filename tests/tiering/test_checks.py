from __future__ import annotations

import pytest

from tierkv.errors import ConfigError
from tierkv.tiering.checks import at_least, one_of


def test_good_values_are_returned() -> None:
    assert one_of("src", "codec", "int8", ("raw", "int8")) == "int8"
    assert at_least("src", "threads", 1, 1) == 1
    assert at_least("src", "timeout", 0.5, 0.001) == 0.5


def test_bad_values_name_source_key_and_what_was_expected() -> None:
    with pytest.raises(ConfigError) as err:
        one_of("src", "codec", "zstd", {"raw": 1, "int8": 2})
    assert (err.value.source, err.value.key) == ("src", "codec")
    assert err.value.problem == "expected one of 'raw', 'int8', got 'zstd'"
    with pytest.raises(ConfigError) as err:
        at_least("src", "threads", 0, 1)
    assert err.value.key == "threads" and err.value.problem == "expected at least 1, got 0"
