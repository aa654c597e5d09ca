"""``python -m posenc.cli``: the ``posenc`` command."""

import os
import sys

# ``python -m`` puts the working directory first on the import path; nothing there may be imported
# by accident (a stray torch.py or a dataset's neighbour), so it goes before any command runs.
_cwd = os.getcwd()
sys.path[:] = [p for p in sys.path if p not in ("", _cwd)]

from . import main  # noqa: E402

sys.exit(main())
