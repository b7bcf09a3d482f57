"""Which addresses a delivery may connect to, decided on the address the host resolved to for this attempt.

The host is resolved once per attempt and the connection goes to that very address (the name is kept for
TLS), so a name that resolves differently between the check and the connection cannot slip past.
Private, loopback, link-local, multicast and reserved ranges are denied unless the endpoint allows them
(``allow_addresses``); ``deny_addresses`` denies more. The main configuration's ``delivery.allow_addresses``
and ``delivery.deny_addresses`` apply to every endpoint on top of its own lists: the gateway's deny wins over
any allow, so one list shuts a network off for every partner at once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from gateway.delivery.errors import BlockedAddressError
from gateway.errors import clip
from gateway.marked import MarkedDict, MarkedList, Where, expect_list

__all__ = ["AddressPolicy", "parse_networks", "parse_policy"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(items: MarkedList, where: Where, what: str) -> tuple[Network, ...]:
    """CIDR blocks (or single addresses) of a list; ConfigError naming the one that is wrong."""
    out = []
    for i, item in enumerate(items):
        try:
            out.append(ipaddress.ip_network(str(item), strict=False))
        except ValueError:
            raise items.at(i).error(
                f"{what}: {clip(repr(item), 60)} is not an address or CIDR block such as 10.0.0.0/8 or 2001:db8::/32"
            ) from None
    return tuple(out)


def _special(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or not address.is_global
    )


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """An endpoint's allowed and denied networks under the gateway's; everything not special (unless
    ``special`` is off) and not denied is allowed."""

    allow: tuple[Network, ...] = ()
    deny: tuple[Network, ...] = ()
    gateway_allow: tuple[Network, ...] = ()
    gateway_deny: tuple[Network, ...] = ()
    #: private, loopback and reserved addresses denied unless allowed
    special: bool = True

    def within(self, gateway: AddressPolicy) -> AddressPolicy:
        """This endpoint's policy under the gateway's lists (*gateway*'s ``allow`` and ``deny``)."""
        return replace(self, gateway_allow=gateway.allow, gateway_deny=gateway.deny)

    def check(self, text: str) -> None:
        """Raise :class:`BlockedAddressError` unless a connection to *text* is allowed."""
        address = ipaddress.ip_address(text)
        if any(address in net for net in self.gateway_deny):
            raise BlockedAddressError(f"address {text} is in the gateway's delivery.deny_addresses")
        if any(address in net for net in self.deny):
            raise BlockedAddressError(f"address {text} is in the endpoint's deny_addresses")
        if any(address in net for net in self.allow) or any(address in net for net in self.gateway_allow):
            return
        if self.special and _special(address):
            raise BlockedAddressError(
                f"address {text} is private, loopback or reserved; list it in the endpoint's allow_addresses "
                "(or the gateway's delivery.allow_addresses) if the partner really is there"
            )

    async def resolve(self, host: str, port: int) -> str:
        """Resolve *host* (or take its answer of the last few seconds) and return the address to connect to;
        every address it has must be allowed."""
        try:
            ipaddress.ip_address(host)
            addresses = [host]
        except ValueError:
            addresses = await _lookup(host, port)
        if not addresses:
            raise OSError(f"{host} has no address")
        for address in addresses:
            self.check(address)
        return addresses[0]

    async def pin(self, url: str) -> tuple[str, str, dict[str, str]]:
        """The checked address of *url*'s host, so the connection goes where the check looked: the URL with
        that address for its host, the ``Host`` header, and the request extensions that keep the name for TLS."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        default = 443 if parts.scheme == "https" else 80
        port = parts.port or default
        address = await self.resolve(host, port)
        shown = f"[{address}]" if ":" in address else address
        target = parts._replace(netloc=f"{shown}:{port}").geturl()
        named = f"[{host}]" if ":" in host else host
        host_header = named if parts.port in (None, default) else f"{named}:{port}"
        return target, host_header, ({"sni_hostname": host} if parts.scheme == "https" else {})


#: how long a host's addresses are reused (seconds): every attempt still checks them and connects to them,
#: so the cache saves the resolver's round trip (a thread of the loop's executor) and nothing else
RESOLVE_TTL = 5.0
_RESOLVED: dict[tuple[str, int], tuple[float, list[str]]] = {}
_RESOLVED_MAX = 1024


async def _lookup(host: str, port: int) -> list[str]:
    now = time.monotonic()
    hit = _RESOLVED.get((host, port))
    if hit is not None and hit[0] > now:
        return hit[1]
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if len(_RESOLVED) >= _RESOLVED_MAX:
        _RESOLVED.clear()
    _RESOLVED[(host, port)] = (now + RESOLVE_TTL, addresses)
    return addresses


def parse_policy(section: MarkedDict, what: str) -> AddressPolicy:
    """The ``allow_addresses`` and ``deny_addresses`` of a mapping (ConfigError naming the wrong entry)."""
    lists = []
    for key in ("allow_addresses", "deny_addresses"):
        where = section.at(key)
        lists.append(parse_networks(expect_list(section.get(key), where, f"{what}{key}"), where, f"{what}{key}"))
    return AddressPolicy(lists[0], lists[1])
