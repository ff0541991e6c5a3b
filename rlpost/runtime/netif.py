"""Which network interface carries an address on this host (Linux, standard library only).

The collectives pick their interface by name (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME); a node
known by its cluster address needs the name of the interface that holds it: the interface
whose address it is, or else the one whose subnet contains it (127.0.0.2 is on `lo`).
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

SIOCGIFADDR = 0x8915
SIOCGIFNETMASK = 0x891B


def _ioctl_ipv4(sock: socket.socket, request: int, name: str) -> str | None:
    packed = struct.pack("256s", name.encode()[:15])
    try:
        answer = fcntl.ioctl(sock.fileno(), request, packed)
    except OSError:  # no IPv4 address on this interface
        return None
    return socket.inet_ntoa(answer[20:24])


def interfaces() -> dict[str, ipaddress.IPv4Interface]:
    """Each interface with an IPv4 address: its address and subnet."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            address = _ioctl_ipv4(sock, SIOCGIFADDR, name)
            mask = _ioctl_ipv4(sock, SIOCGIFNETMASK, name)
            if address and mask:
                found[name] = ipaddress.IPv4Interface(f"{address}/{mask}")
    return found


def interface_for(address: str) -> str | None:
    """The interface holding `address` here, or None (an IPv6 address, or none matches)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if not isinstance(ip, ipaddress.IPv4Address):
        return None
    table = interfaces()
    exact = [name for name, iface in table.items() if iface.ip == ip]
    if exact:
        return exact[0]
    containing = [name for name, iface in table.items() if ip in iface.network]
    return containing[0] if containing else None
