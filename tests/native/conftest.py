"""tests/native: the C collator (trioserve._collate) against its pure-Python reference.

``TRIOSERVE_NATIVE_BUILD=DIR`` makes these tests load the extension from ``DIR/trioserve/``
instead of the source tree's build; ``native/sanitize.sh`` points it at a build with
AddressSanitizer and UBSan (and sets ``TRIOSERVE_NATIVE_SANITIZED=1``, which
``test_build.py`` checks). It must take effect before anything imports the extension,
hence here, at conftest import time.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trioserve

_BUILD = os.environ.get("TRIOSERVE_NATIVE_BUILD")
if _BUILD:
    if "trioserve._collate" in sys.modules:
        raise RuntimeError(
            "TRIOSERVE_NATIVE_BUILD is set but trioserve._collate was imported before "
            "tests/native/conftest.py; run tests/native on its own"
        )
    trioserve.__path__.insert(0, str(Path(_BUILD).resolve() / "trioserve"))
