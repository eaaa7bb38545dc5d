"""The address `serve` listens on, as --host gives it: checked before anything loads.

Plain Python (no server packages), so `serve --help` and a refused --host stay cheap.
"""

from __future__ import annotations

import re

from ..errors import ConfigError

# Every interface, said in full: the server has no authentication, so opening it to the network is
# never the result of a value that merely reads as "any" to the socket library ("", 0, 0.0, 0x0 ...).
EVERY_INTERFACE = ("0.0.0.0", "::")
_HOSTNAME = re.compile(r"(?=.*[A-Za-z])[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?")
_HOST_FIX = (
    "an address to listen on: 127.0.0.1 (this host only, the default), 0.0.0.0 or :: (every interface, "
    "on purpose), or one address (or name) of this host, e.g. ::1 or 192.168.1.5"
)


def listen_address(host: str) -> str:
    """--host as the socket gets it: an IP address written in full or a host name; [::1] is ::1.

    Anything the socket library would also take, but that does not say plainly what it means, is a
    ConfigError: "" and "0" listen on every interface, "127.1" is 127.0.0.1, "::0" is "::"."""
    import ipaddress

    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if text in EVERY_INTERFACE:
        return text
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        address = None
    if address is not None and not _every_interface(address):
        return text
    if address is None and _HOSTNAME.fullmatch(text) and not _numeric_shorthand(text):
        return text
    raise ConfigError("--host", host, _HOST_FIX)


def _numeric_shorthand(text: str) -> bool:
    """Whether the C library reads `text` as an IPv4 address (0x7f.1, 0x0) though it is no dotted quad."""
    import socket

    try:
        socket.inet_aton(text)
    except OSError:
        return False
    return True


def url_host(host: str) -> str:
    """`host` as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def bound_everywhere(host: str, bound: str) -> bool:
    """Whether a socket asked for `host` was bound to every interface though --host did not say so
    in full (a name whose address is 0.0.0.0, say)."""
    import ipaddress

    try:
        address = ipaddress.ip_address(bound.split("%", 1)[0])
    except ValueError:
        return False
    return host not in EVERY_INTERFACE and _every_interface(address)


def _every_interface(address) -> bool:
    """Whether an IP address means every interface: 0.0.0.0, ::, or ::ffff:0.0.0.0 (which a
    dual-stack socket reads as 0.0.0.0)."""
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_unspecified or bool(mapped and mapped.is_unspecified)
