"""Which IP addresses a fetch may connect to: public unicast only, judged after unwrapping every
form that embeds an IPv4 address in IPv6 (Python's `is_global` calls `64:ff9b::a9fe:a9fe` global,
although a NAT64 gateway delivers it to 169.254.169.254, the cloud metadata service)."""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the IPv4 address is the low 32 bits
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: the embedding depends on the operator
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated, still routed by some stacks
IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # SIIT (RFC 2765)
# cloud metadata services: refused even when private addresses are allowed (tests, internal mirrors)
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254", "192.0.0.192"))


def _low32(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)


def embedded(address: IPAddress) -> list[IPAddress]:
    """The address itself and every IPv4 address it carries (NAT64, 6to4, Teredo, mapped, compatible)."""
    if isinstance(address, ipaddress.IPv4Address):
        return [address]
    found: list[IPAddress] = [address]
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    if address in NAT64_WELL_KNOWN or address in NAT64_LOCAL_USE or address in IPV4_TRANSLATED:
        found.append(_low32(address))
    if address in IPV4_COMPATIBLE and int(address) > 1:
        found.append(_low32(address))
    return found


def refusal(address: IPAddress, *, allow_private: bool) -> str | None:
    """Why a connection to `address` is refused, or None when it may be used."""
    for inner in embedded(address):
        if inner in METADATA_ADDRESSES:
            return f"{address} is a cloud metadata service address"
        if allow_private:
            continue
        if address in NAT64_LOCAL_USE:
            return f"{address} is in the local-use NAT64 range 64:ff9b:1::/48"
        if not inner.is_global or inner.is_multicast:
            shown = address if inner == address else f"{address} (carrying {inner})"
            return f"{shown} is not a public unicast address"
    return None
