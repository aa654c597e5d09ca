"""Settings every test runs under, whatever the machine running them holds."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _no_machine_tuning(tmp_path_factory):
    """The plan reads ``posenc tune``'s measurement from ``~/.cache/posenc/tune.json`` and
    POSENC_BIAS_BACKWARD: a developer's file would change which backward the tests see. Every
    test starts from the default; a test of tuning sets its own file or variable."""
    patch = pytest.MonkeyPatch()
    patch.setenv("POSENC_TUNE_FILE", str(tmp_path_factory.mktemp("tune") / "absent.json"))
    patch.delenv("POSENC_BIAS_BACKWARD", raising=False)
    yield
    patch.undo()
