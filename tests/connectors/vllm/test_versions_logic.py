"""The connector's start-up check of the vLLM version (no vLLM needed: the version is a string)."""

from __future__ import annotations

import logging

import pytest

from tierkv.connectors.vllm.versions import OVERRIDE_ENV, check_vllm, release
from tierkv.errors import ConfigError


@pytest.mark.parametrize("version", ["0.32.0", "0.32.1+cpu", "0.33.0", "0.33.2rc1.dev12+g0abc"])
def test_tested_releases_start(version: str) -> None:
    check_vllm(version, environ={})


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.0.0", "0.10.1", "dev"])
def test_other_releases_are_refused_with_the_version_named(version: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"vLLM {version} is not a release .* tested with \(0\.32\.x to 0\.33\.x\)"
    ):
        check_vllm(version, environ={})


def test_the_override_starts_an_untested_release_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_vllm("0.34.0", environ={OVERRIDE_ENV: "1"})
    assert "vLLM 0.34.0 is not a release" in caplog.text
    with pytest.raises(ConfigError):
        check_vllm("0.34.0", environ={OVERRIDE_ENV: "0"})


def test_release_reads_major_and_minor() -> None:
    assert release("0.33.0+cpu") == (0, 33)
    assert release(" 1.2") == (1, 2)
    assert release("unknown") is None
