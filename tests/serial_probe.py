"""Run only by tests/test_serial_group.py in an inner pytest under xdist (its name keeps the suite from
collecting it): one test marked serial, one not."""

import pytest


@pytest.mark.serial
def test_marked_serial() -> None:
    assert True


def test_not_serial() -> None:
    assert True
