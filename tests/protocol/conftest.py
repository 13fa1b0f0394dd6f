"""Fixtures for the protocol tests."""

import logging

import pytest


@pytest.fixture
def libp2p_records():
    """Every record py-libp2p logs (its logger does not propagate, so caplog alone misses them)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    library = logging.getLogger("libp2p")
    handler, level = Keep(level=logging.DEBUG), library.level
    library.addHandler(handler)
    library.setLevel(logging.WARNING)  # as the node runs it
    yield records
    library.removeHandler(handler)
    library.setLevel(level)
