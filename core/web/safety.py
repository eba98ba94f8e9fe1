"""Where a page fetch may go: http and https only, no user:password@, the host resolved once and every address checked
(loopback, private, link-local, carrier-grade NAT, multicast, reserved, unspecified, cloud metadata; IPv4 inside IPv6
as the IPv4 address it holds; legacy numeric forms such as 0177.0.0.1 or 2130706433 as the address they mean), and
the connection pinned to the checked addresses (PinnedResolver) so a second lookup cannot lead elsewhere. Addresses
named in WEB_ALLOW_PRIVATE (and their port) may be private; cloud metadata, unspecified and multicast never are."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from core.constants import WEB_SHOWN_URL_CHARS
from core.settings import AllowedTarget

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolve = Callable[[str], Awaitable[Sequence[str]]]  # a host name → its addresses (OSError when it has none)

SCHEMES = ("http", "https")
METADATA_NAMES = frozenset({"metadata.google.internal", "metadata"})  # refused by name, before any lookup
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, …
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure's wire server
    )
)
CARRIER_GRADE_NAT = ipaddress.ip_network("100.64.0.0/10")
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # an IPv4 address in its last 32 bits, reached through a gateway
# What inet_aton (and so getaddrinfo) reads as an IPv4 address: 1 to 4 parts, each decimal, octal (0…) or hex (0x…).
LEGACY_IPV4 = re.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}\.?", re.IGNORECASE)


@dataclass(frozen=True)
class NoPage:
    """A fetch that gave no page; `message` is one line for the model and the person (no traceback, no secret)."""

    message: str


@dataclass(frozen=True)
class Refused(NoPage):
    """Not fetched on purpose: the message starts with `refused:` and says why."""


@dataclass(frozen=True)
class Failed(NoPage):
    """The network or the server failed (timeout, no such name, connection refused, HTTP 4xx/5xx, …)."""


@dataclass(frozen=True)
class Target:
    """A checked address: the URL to request, and the only addresses its host may be reached at."""

    url: URL
    host: str
    port: int
    addresses: tuple[str, ...]


async def system_resolve(host: str) -> list[str]:
    """The host's addresses from the platform's resolver (getaddrinfo, off the event loop)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def shown(url: URL | str) -> str:
    """An address as a failure's line shows it: without user or password, cut to WEB_SHOWN_URL_CHARS."""
    text = str(url)
    if isinstance(url, URL) and url.is_absolute():
        text = str(url.with_user(None))
    return text if len(text) <= WEB_SHOWN_URL_CHARS else text[: WEB_SHOWN_URL_CHARS - 1] + "…"


async def check(url: URL | str, allow: tuple[AllowedTarget, ...], resolve: Resolve) -> Target | NoPage:
    """The URL as a Target whose every address may be fetched, or why not (Refused), or Failed if its name does not
    resolve. The name is resolved once, here."""
    try:
        parsed = url if isinstance(url, URL) else URL(url.strip())
    except (ValueError, TypeError):
        return Refused("refused: that is not a web address")
    if parsed.scheme not in SCHEMES:
        return Refused("refused: only http and https")
    if parsed.user is not None or parsed.password is not None:
        return Refused("refused: an address with a user name or password in it")
    host, port = parsed.raw_host, parsed.port
    if not host or port is None:
        return Refused("refused: that is not a web address")
    name = host.lower().rstrip(".")
    if name in METADATA_NAMES:
        return Refused(f"refused: {name} is a cloud metadata address")
    literal = _literal(name)
    if isinstance(literal, Refused):
        return literal
    if literal is not None:
        addresses: list[Address] = [literal]
        if isinstance(literal, ipaddress.IPv4Address) and name != str(literal):  # a legacy form: ask for what it means
            parsed = parsed.with_host(str(literal))
    else:
        found = await _lookup(host, resolve)
        if isinstance(found, str):
            return Failed(f"could not fetch {shown(parsed)}: {found}")
        addresses = found
    for address in addresses:
        reason = refusal(address, port, allow)
        if reason is not None:
            return Refused(f"refused: {_named(host, address, resolved=literal is None)} {reason}")
    return Target(parsed, host, port, tuple(dict.fromkeys(str(_unmapped(a)) for a in addresses)))


def refusal(address: Address, port: int, allow: tuple[AllowedTarget, ...]) -> str | None:
    """Why this address (on this port) may not be fetched, as the end of a sentence ("a loopback address"); None: it
    may. Metadata, unspecified and multicast addresses are refused even when WEB_ALLOW_PRIVATE lists them."""
    address = _unmapped(address)
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_multicast:
        return "a multicast address"
    if any(address in network and allowed_port in (None, port) for network, allowed_port in allow):
        return None
    inside = _embedded(address)
    if inside is not None:
        kind = refusal(inside, port, ())
        return None if kind is None else f"{kind} inside an IPv6 address"
    return _kind(address)


def _kind(address: Address) -> str | None:
    """What makes an address not public ("a private address"); None for a public one."""
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address in CARRIER_GRADE_NAT:
        return "a carrier-grade NAT address"
    if address.is_private:
        return "a private address"
    if address.is_reserved:
        return "a reserved address"
    if not address.is_global:
        return "not a public address"
    return None


def _unmapped(address: Address) -> Address:
    """An IPv4-mapped IPv6 address (::ffff:127.0.0.1) as the IPv4 address it holds; others as they are."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _embedded(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a 6to4, Teredo (its client) or NAT64 address leads to; None for other addresses."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _literal(host: str) -> Address | Refused | None:
    """The address a numeric host means (an IP, or a legacy form such as 127.1, 0x7f.0.0.1, 2130706433, read the way
    inet_aton reads it); None for a name; Refused for a number that is no address."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not LEGACY_IPV4.fullmatch(host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host.rstrip(".")))
    except OSError:
        return Refused(f"refused: {host} is not a valid address")


async def _lookup(host: str, resolve: Resolve) -> list[Address] | str:
    """The host's addresses, resolved once; a one-line reason (str) if it has none."""
    try:
        raw = await resolve(host)
    except (OSError, UnicodeError):
        return f"the name {host} does not resolve"
    addresses: list[Address] = []
    for item in raw:
        try:
            addresses.append(ipaddress.ip_address(item))
        except ValueError:
            return f"the name {host} resolves to something that is no address"
    return addresses or f"the name {host} does not resolve"


def _named(host: str, address: Address, *, resolved: bool) -> str:
    """The refused address as a refusal names it: `10.0.0.5 is`, `0177.0.0.1 is 127.0.0.1,`, `x.test resolves to
    10.0.0.5,`."""
    plain = _unmapped(address)
    if host.lower() == str(address):
        return f"{host} is" if plain == address else f"{host} is {plain},"
    return f"{host} resolves to {plain}," if resolved else f"{host} is {plain},"


class PinnedResolver(AbstractResolver):
    """aiohttp's resolver for one fetch: it answers only with the addresses `check` pinned for a host, so the
    connection goes where the check looked (no second lookup, no DNS rebinding); any other host is an error."""

    def __init__(self) -> None:
        """No host pinned yet."""
        self._pins: dict[str, tuple[str, ...]] = {}

    def pin(self, target: Target) -> None:
        """From now on, `target.host` is reached at its checked addresses only."""
        self._pins[target.host.lower().rstrip(".")] = target.addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The pinned addresses of `host` (in the order they were checked)."""
        addresses = self._pins.get(host.lower().rstrip("."))
        if not addresses:
            raise OSError(f"{host} was not checked before connecting")
        return [
            ResolveResult(
                hostname=host,
                host=a,
                port=port,
                family=socket.AF_INET6 if ":" in a else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for a in addresses
        ]

    async def close(self) -> None:
        """Nothing to release."""
