"""A test HTTP server on loopback, served from a thread for the length of a ``with`` block."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import HTTPServer


@contextmanager
def serving(httpd: HTTPServer) -> Iterator[str]:
    """Serve ``httpd`` (bound to 127.0.0.1) from a thread; yield its base URL; then shut it
    down and wait for the thread."""
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
