"""When the functional tests may be skipped, and when a missing tool must fail the run."""

import pytest

from devtools.sandbox import MissingTools, skip_reason


def test_without_root_the_functional_tests_are_skipped_with_the_reason():
    assert "root" in skip_reason(1000, ["ovn-northd"])


def test_as_root_a_missing_tool_fails_the_run_and_names_it():
    with pytest.raises(MissingTools, match="ovn-northd, curl"):
        skip_reason(0, ["ovn-northd", "curl"])


def test_as_root_with_every_tool_they_run():
    assert skip_reason(0, []) is None
