"""The browser tests drive a real JupyterLab in headless Chromium: slow (minutes) and in need of Chromium, so
they run only when asked for:

    MINIGPT_BROWSER_TEST=1 python -m pytest tests/browser
    python -m pytest tests/browser --run-browser

(``--run-browser`` is known to pytest only when tests/browser is on the command line, since this conftest
registers it.) See docs/browser-test.md.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_addoption(parser):
    parser.addoption("--run-browser", action="store_true", default=False,
                     help="run the JupyterLab browser tests in tests/browser (also: MINIGPT_BROWSER_TEST=1)")


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives JupyterLab in headless Chromium (opt-in: --run-browser "
                                       "or MINIGPT_BROWSER_TEST=1)")


def browser_tests_enabled(config) -> bool:
    opt = False
    try:
        opt = config.getoption("--run-browser")
    except ValueError:  # option not registered (this conftest was not loaded at start-up)
        pass
    return bool(opt) or os.environ.get("MINIGPT_BROWSER_TEST", "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    if browser_tests_enabled(config):
        return
    skip = pytest.mark.skip(reason="browser test: opt in with MINIGPT_BROWSER_TEST=1 or --run-browser")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)
