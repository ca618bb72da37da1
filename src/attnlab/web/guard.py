"""Keeping the local viewer local: the host names it answers to, same-origin POSTs, the bind check.

A server on 127.0.0.1 is still reachable from any web page the user opens: a page can POST to
``http://127.0.0.1:8765`` (cross-origin), or point a domain of its own at 127.0.0.1 (DNS
rebinding) and then read the answers as same-origin. The first sends an ``Origin`` that is not the
viewer's; the second a ``Host`` that is not one of the viewer's names. :class:`LocalOnly` refuses
both before any endpoint runs.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def host_name(host_header: str) -> str:
    """'LocalHost:8765' → 'localhost', '[::1]:8765' → '[::1]', '127.0.0.1' → '127.0.0.1'."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[: h.find("]") + 1] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def url_name(host: str) -> str:
    """How ``host`` appears in a URL or a Host header: IPv6 addresses in brackets, lower case."""
    h = host.strip().lower()
    return f"[{h}]" if ":" in h and not h.startswith("[") else h


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost': only this machine can connect."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_warning(host: str) -> str | None:
    """The warning for a ``--host`` other machines can reach, or None for a loopback address."""
    if is_loopback(host):
        return None
    return (f"warning: --host {host} makes the viewer reachable from the network: anyone who can reach this "
            "machine can use it and its CPU. Use --host 127.0.0.1 (the default) to keep it to this machine.")


def allowed_hosts(host: str | None = None) -> frozenset[str]:
    """The Host names a viewer bound to ``host`` answers to: the loopback names and ``host`` itself.

    Bound to every address (0.0.0.0, ::) it also answers to this machine's name and to any IP
    address: DNS rebinding needs a domain name in ``Host``, and an address literal cannot carry one.
    """
    names = set(LOOPBACK_NAMES)
    if host is None:
        return frozenset(names)
    if host.strip().lower() in WILDCARDS:
        names |= {"*ip*", socket.gethostname().lower()}
    else:
        names.add(url_name(host))
    return frozenset(names)


def _refuse(status: int, detail: str):
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

    async def respond(send) -> None:  # noqa: ANN001
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return respond


class LocalOnly:
    """ASGI middleware: a request whose ``Host`` is not one of ``hosts`` gets 400, a POST (any
    unsafe method) whose ``Origin`` is not the viewer's own gets 403. A request without ``Origin``
    (curl, scripts) passes: browsers send it with every cross-origin POST."""

    def __init__(self, app, hosts: Iterable[str]) -> None:  # noqa: ANN001
        self.app = app
        self.hosts = frozenset(hosts)

    def host_ok(self, name: str) -> bool:
        return name in self.hosts or ("*ip*" in self.hosts and is_ip_literal(name))

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host")
        if host is not None and not self.host_ok(host_name(host)):
            shown = ", ".join(sorted(h for h in self.hosts if h != "*ip*"))
            return await _refuse(400, f"Host {host!r} is not a name this viewer answers to ({shown}); "
                                      "open it at http://127.0.0.1 and its port")(send)
        origin = headers.get("origin")
        if scope["method"] not in SAFE_METHODS and origin is not None:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or host is None or parts.netloc.lower() != host.strip().lower():
                return await _refuse(403, f"cross-origin {scope['method']} refused: Origin {origin!r} is not this "
                                          "viewer's page; the viewer takes requests from its own page only")(send)
        await self.app(scope, receive, send)


def check_port(host: str, port: int) -> None:
    """Fail with a clear OSError when ``host:port`` cannot be bound (no such address, in use)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise OSError(f"cannot bind to {host}: {e.strerror or e} (--host takes an address or name of this machine, "
                      "such as 127.0.0.1)") from None
    family, _, _, _, address = infos[0]
    try:
        with socket.create_server(address[:2], family=family):
            pass
    except OSError as e:
        reason = os.strerror(e.errno).lower() if e.errno and e.errno > 0 else (e.strerror or str(e))
        if e.errno == errno.EADDRINUSE:
            raise OSError(f"cannot listen on {host}:{port}: {reason}; pick another --port or --host") from None
        raise OSError(f"cannot bind to {host}: {reason} (--host takes an address of this machine, such as "
                      "127.0.0.1)") from None
