"""An HTTP/1.1 request with no Host header, or with two, is a 400 from the demo under
every server flavour (RFC 9112, section 3.2): h11 refuses them itself, httptools lets them
through to the app, which refuses them. Sent on raw sockets, as no HTTP client would."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from essessey.demo import create_app
from tests.processes import WAIT
from tests.servers import serve

FLAVOURS = ["h11", "httptools"]


@pytest.fixture(scope="module", params=FLAVOURS)
def demo(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    with serve(create_app(), lifespan="on", http=request.param) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def status_of(address: tuple[str, int], head: bytes) -> int:
    """The status line's code of the answer to ``head`` (a request with no body)."""
    with socket.create_connection(address, timeout=WAIT) as connection:
        connection.sendall(head)
        answer = b""
        while b"\r\n" not in answer:
            piece = connection.recv(4096)
            if not piece:
                break
            answer += piece
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /favicon.ico HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n", 200),
        (b"GET /favicon.ico HTTP/1.1\r\nConnection: close\r\n\r\n", 400),
        (b"GET /favicon.ico HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n", 400),
        (b"GET /favicon.ico HTTP/1.0\r\n\r\n", 200),  # HTTP/1.0 may leave it out
    ],
    ids=["one Host", "no Host", "two Hosts", "HTTP/1.0 without"],
)
def test_a_request_line_the_spec_refuses_is_a_400(
    demo: tuple[str, int], head: bytes, status: int
) -> None:
    assert status_of(demo, head) == status
