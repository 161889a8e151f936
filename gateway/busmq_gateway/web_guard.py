"""What the HTTP listener refuses to a browser visiting other sites: requests for other
host names (DNS rebinding), state-changing requests that another site could forge
(CSRF), and being framed or sniffed. Every response carries the headers a browser
honours.

- **Host names.** A page on ``evil.example`` whose name is rebound to 127.0.0.1 reaches a
  loopback listener with ``Host: evil.example``: only the listener's own names are
  answered (the listen address, ``localhost``, ``127.0.0.1`` and ``[::1]``, with its port;
  any IP address when it listens on every interface, since a rebinding needs a name; and
  ``--http-allowed-hosts``, e.g. the name a proxy forwards). Others get ``421``, on every
  path but ``/healthz`` and ``/readyz``.
- **Forged requests.** Every request that is not a read (``POST`` and any later verb)
  must come from the dashboard itself: its ``Origin`` (or, without one,
  ``Sec-Fetch-Site``) is the listener's own origin; its body is ``application/json`` (a
  cross-site form can send only form or text bodies); and it is authorized by a bearer
  secret, never by basic auth, whose credentials a browser attaches by itself.

Refusals are ``403`` (``421`` for a host) with a JSON ``error`` naming the rule, logged at
warning level with the remote address and ``Origin``.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

log = logging.getLogger("busmq_gateway.dashboard")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ANY_HOST_PATHS = frozenset({"/healthz", "/readyz"})
READS = frozenset({"GET", "HEAD", "OPTIONS"})
SAME_SITE = frozenset({"same-origin", "none"})  # "none": typed in, a bookmark
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data", "text/plain")
SECURITY_HEADERS = {
    # Scripts only from this listener (its /static/ files; every other response of
    # the same origin is JSON or text, which nosniff keeps from running as a script).
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class WebGuard:
    """The listener's guard: ``middleware`` for an aiohttp application."""

    def __init__(self, listen_host: str, allowed_hosts: Iterable[str]) -> None:
        self._listen_host = listen_host.strip("[]").lower()
        self._allowed = {h.lower() for h in allowed_hosts}
        self.port = 0  # the bound port, set once the listener started

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = self._refusal(request)
        if refusal is not None:
            status, rule, message = refusal
            log.warning(
                "dashboard: refused %s %s from %s (Host %r, Origin %r): %s",
                request.method, request.path, request.remote, request.host,
                request.headers.get("Origin"), rule,
            )  # fmt: skip
            response: web.StreamResponse = web.json_response(
                {"error": message, "rule": rule}, status=status
            )
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:  # a 404, a redirect: raised, not returned
                exc.headers.update(SECURITY_HEADERS)
                raise
        response.headers.update(SECURITY_HEADERS)
        return response

    def _refusal(self, request: web.Request) -> tuple[int, str, str] | None:
        if request.path not in ANY_HOST_PATHS and not self.host_allowed(request.host):
            return 421, "HOST", f"this listener does not answer for host {request.host!r}"
        if request.method in READS:
            return None
        origin = request.headers.get("Origin")
        if origin is not None:
            # The host part only: behind a TLS-terminating proxy the page is https and
            # the listener sees http, and no other site can send our host as its Origin.
            if origin.partition("://")[2].lower() != request.host.lower():
                return 403, "ORIGIN", "a state-changing request from another origin"
        elif request.headers.get("Sec-Fetch-Site", "same-origin") not in SAME_SITE:
            return 403, "FETCH_SITE", "a state-changing request from another site"
        if request.content_type != "application/json":
            return 403, "CONTENT_TYPE", "a state-changing request needs a JSON body"
        scheme = request.headers.get("Authorization", "").partition(" ")[0].lower()
        if scheme == "basic":
            return (
                403,
                "BASIC_AUTH",
                (
                    "basic auth does not authorize actions (a browser sends it by itself): "
                    "send the admin secret as a bearer secret"
                ),
            )
        return None

    def host_allowed(self, host_header: str) -> bool:
        host, port = _split_host(host_header.lower())
        if host_header.lower() in self._allowed or host in self._allowed:
            return True
        if port != self.port:
            return False
        if host in ("localhost", "127.0.0.1", "::1", self._listen_host):
            return True
        return self._listen_host in ("0.0.0.0", "::", "") and _is_ip(host)


def _split_host(value: str) -> tuple[str, int | None]:
    if value.startswith("["):  # [::1]:8444
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = value.partition(":") if value.count(":") == 1 else (value, "", "")
    return host, int(port) if port.isdigit() else None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
