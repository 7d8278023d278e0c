"""Label values into URLs, headers and log lines: encoded as data, never read as structure.

Used by the executors (``fleet``, ``nvml-agent``, ``webhook``, ``command``, ``log``) wherever
a target's label (scraped from targets: untrusted) goes into something they send or run. A
value that cannot be made safe raises ``PermanentError`` naming the label and why; retrying
would not change the label.

- In a URL's path, query or fragment a value is percent-encoded with nothing kept (``/``, ``?``,
  ``#``, ``@``, ``:``, ``%`` and every non-ASCII byte of its UTF-8 included), so it stays inside
  its segment; ``.`` and ``..`` are refused there (servers resolve even their encoded forms).
- In a URL's authority (``http://{node}:9835``) a value must be a host name or an IP address
  (nothing can be encoded there): anything else is refused.
- In a header value, control characters (CR, LF, NUL, ...), ``%`` and non-ASCII are
  percent-encoded, so a value cannot add a header.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from urllib.parse import quote, urlsplit

from gpuops.actions.base import PermanentError
from gpuops.model.decisions import Decision

_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def target_label(d: Decision, name: str) -> str:
    """The value of the target's label ``name``, as it was scraped (encode it where it goes); a
    target without it, or with it empty, cannot be acted on."""
    value = d.target.labels.get(name)
    if not value:
        raise PermanentError(
            f"{d.action.type if d.action is not None else ''} needs the target label {name!r}; "
            f"the target has {dict(d.target.labels)}"
        )
    return value


def path_segment(value: str, label: str) -> str:
    """``value`` as (part of) one URL path segment, query value or fragment."""
    if value in (".", ".."):
        raise PermanentError(
            f"label {label}={value!r} cannot go into a URL path: it would name another path"
        )
    if "\x00" in value:
        raise PermanentError(f"label {label}={printable(value)} holds a NUL byte")
    return quote(value, safe="")


def host(value: str, label: str) -> str:
    """``value`` as the host of a URL: a DNS name (IDNA-encoded when not ASCII) or an IP,
    optionally with a port (``instance`` labels are ``host:port``)."""
    name, colon, port = value.rpartition(":")
    if colon and name and port.isascii() and port.isdigit() and ":" not in name:
        return f"{_host(name, label, value)}:{int(port)}"
    return _host(value, label, value)


def _host(value: str, label: str, whole: str) -> str:
    try:
        return f"[{ipaddress.IPv6Address(value)}]"
    except ValueError:
        pass
    try:
        ipaddress.IPv4Address(value)
        return value
    except ValueError:
        pass
    try:
        ascii_name = value.encode("idna").decode("ascii")
    except UnicodeError:
        ascii_name = ""
    labels = ascii_name.rstrip(".").split(".")
    if not ascii_name or len(ascii_name) > 253 or not all(map(_HOST_LABEL.fullmatch, labels)):
        raise PermanentError(
            f"label {label}={printable(whole)} is not a host name or IP address, so it cannot "
            "be the host of a URL"
        )
    return ascii_name


def header_value(value: str) -> str:
    """``value`` safe in an HTTP header: printable ASCII kept, the rest percent-encoded."""
    return quote(value, safe=_HEADER_SAFE)


def printable(value: str) -> str:
    """``value`` quoted for a log line or a message: control characters escaped (no new line
    can be forged), other unicode kept."""
    return "'" + _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode(), value) + "'"


def fill_url(
    template: str, labels: Mapping[str, str], fill: Callable[[str, Mapping[str, str]], str]
) -> str:
    """``fill(template, values)`` with each label encoded for where the template puts it: as a
    host in the URL's authority, as a path segment anywhere else. ``fill`` substitutes labels
    (``str.format_map`` or ``gpuops.model.rules.templating.render``)."""
    markers = {name: f"gpuopslabel{index}x" for index, name in enumerate(labels)}
    shape = fill(template, markers)
    netloc = urlsplit(shape).netloc
    values = {}
    for name, value in labels.items():
        if markers[name] in netloc:
            values[name] = host(value, name)
        elif markers[name] in shape:
            values[name] = path_segment(value, name)
    return fill(template, values)


DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url`` (the scheme's port when it has none; an IPv6 host in
    brackets): the server an action reaches, the gate's unit of isolation for executors that
    call a URL (``gpuops.actions.base.lane``). ``ValueError`` when ``url`` names none."""
    parts = urlsplit(url)
    port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    host = parts.hostname or ""
    if port is None or not host:
        raise ValueError(f"no server in {url!r}")
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}"
