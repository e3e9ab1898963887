"""Test-wide settings: no test may reach the network (hub libraries are told to stay offline); shared fixtures."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ray: needs Ray (the ray extra: ./run_all.sh --with-ray); skipped without it")


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


@pytest.fixture
def drawn(monkeypatch):
    """Figure file name -> the matplotlib Figure saved under it (the file is still written): the report's figure
    tests inspect what was drawn (titles, line colours and styles, points)."""
    from bench.report import figures

    saved = {}
    real = figures._save

    def keep(fig, out_dir, name):
        saved[name] = fig
        out_dir.mkdir(parents=True, exist_ok=True)  # build_figures makes it; these tests call builders directly
        return real(fig, out_dir, name)

    monkeypatch.setattr(figures, "_save", keep)
    return saved
