"""Splitting the http(s) URLs of kube-proxy's endpoints (the command line's and the client's)."""

from __future__ import annotations

from typing import NamedTuple


class Url(NamedTuple):
    scheme: str
    host: str  # lowercased; an IPv6 literal without its brackets
    port: int | None
    target: str  # the path ("/" when empty) and the query, as a request line names them
    netloc: str


def split_url(url: str) -> Url:
    """SCHEME://[USER@]HOST[:PORT][/PATH][?QUERY][#FRAGMENT], read as urllib.parse.urlsplit
    reads it (tests/unit compare the two); ValueError for a bad port or bracket. Not urlsplit:
    urllib.parse imports ipaddress, both a cold audit's cost for two URLs it only splits."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme.isascii() or not scheme[:1].isalpha():
        scheme, rest = "", ""
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:].partition("#")[0]
    path, _, query = tail.partition("?")
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):
        host, bracket, after = hostport[1:].partition("]")
        if not bracket:
            raise ValueError("Invalid IPv6 URL")
        port_text = after[1:] if after.startswith(":") else after
    else:
        if "]" in hostport:
            raise ValueError("Invalid IPv6 URL")
        host, _, port_text = hostport.partition(":")
    port = None
    if port_text:
        if not (port_text.isascii() and port_text.isdigit()):
            raise ValueError(f"Port could not be cast to integer value as {port_text!r}")
        port = int(port_text)
        if port > 65535:
            raise ValueError("Port out of range 0-65535")
    target = (path or "/") + (f"?{query}" if query else "")
    return Url(scheme.lower(), host.lower(), port, target, netloc)
