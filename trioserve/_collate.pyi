# The cffi extension built from native/ (see native/build_collate.py). cffi objects are
# dynamic; trioserve/collate.py is the typed surface.
from typing import Any

ffi: Any
lib: Any
