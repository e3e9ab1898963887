"""Test-wide settings: no test may reach the network (hub libraries are told to stay offline); shared fixtures."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def one_thread():
    """One torch thread: the tiny models of the engine tests, where on a shared 2-core machine a second thread mostly
    waits (tests/test_control.py's supervised start: 2 s instead of 19 s). A module opts in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
