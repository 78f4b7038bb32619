"""A real HTTP server for an ASGI app: uvicorn on a free ``127.0.0.1`` port, in a thread.

For tests whose client is not Python (a browser): the app runs in the thread's own event
loop, with its own engine and pool (its startup hooks run there), against the same
database as the rest of the test.  Use as a context manager::

    with LiveServer(create_app(settings)) as server:
        ...  # server.url is "http://127.0.0.1:<port>"
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Self

import uvicorn


class LiveServer:
    def __init__(self, app: Any, *, start_timeout: float = 15.0) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, loop="asyncio", lifespan="on", log_level="warning", access_log=False
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )
        self._start_timeout = start_timeout

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the live server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._socket.close()
