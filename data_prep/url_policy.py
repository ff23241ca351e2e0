"""Which source URLs may reach img2dataset: web images only.

img2dataset fetches a row with urllib's `urlopen`, which also opens file:// (any file the job's user can
read on the shared file system), ftp:// and data: URLs, and which connects to whatever address a host
names, the cloud's instance-metadata service included. A dataset from the Hub, or a parquet someone
else wrote, must not pull either into the training tars. So a URL is kept only when it is http or
https and its host is not a link-local or cloud-metadata address; download_parquet drops and counts the
others, and download_images refuses them again for parquet written by other tools.

    >>> refusal("http://127.0.0.1:8000/a.jpg") is None
    True
    >>> refusal("file:///etc/passwd"), refusal("http://169.254.169.254/latest/meta-data/")
    ('scheme file', 'metadata address')

What is checked is what urllib will connect to: the host is percent-decoded (urllib unquotes it), and
IPv4 hosts in the legacy forms that getaddrinfo accepts (2852039166, 0xa9fea9fe, 0251.0376.0251.0376)
are read as the address they name. Host names are not resolved (millions of rows; the answer could
change by the time the job runs), except the metadata service's own names. Redirects are followed by
urllib inside img2dataset's worker processes and are not checked here (see docs/hostile-sources.md).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections import Counter
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

# Recorded in download_parquet's inputs: a manifest written under another policy is not reused.
URL_POLICY = 1
# download_images expands a leading ${NAME} from the environment (the offline demo's server); the
# expanded URL is checked again there.
PLACEHOLDER = r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}/"
_WEB = r"(?i)^https?://"
# Hosts worth a closer look in Python: anything that may spell an IP address (digits, hex, dots,
# brackets, percent-encoding, user info) or a metadata service name. Ordinary DNS names skip it.
_SUSPECT_HOST = r"(?i)^https?://([^/?#]*[%\[\]@\\]|[0-9a-fx.:]*(?:[/?#]|$)|[^/?#]*(metadata|instance-data))"
METADATA_NAMES = frozenset(
    {"metadata.google.internal", "metadata", "instance-data", "instance-data.ec2.internal"}
)
METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
LINK_LOCAL_V4 = ipaddress.ip_network("169.254.0.0/16")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host names literally, as getaddrinfo would read it; None for a DNS name."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 zone id does not change it
    except ValueError:
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))  # 2852039166, 0xa9fea9fe, 0251.0376...
        except (OSError, ValueError):
            return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _host(netloc: str) -> str:
    """The host urllib connects to for a netloc: percent-decoded, no user info, no port, no final dot."""
    host = unquote(netloc).rsplit("@", 1)[-1]
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".").lower()


def host_refusal(netloc: str) -> str | None:
    """Why a URL's host must not be fetched ('metadata address', 'link-local address'), or None."""
    host = _host(netloc)
    if host in METADATA_NAMES:
        return "metadata address"
    address = _address(host)
    if address is None:
        return None
    if address in METADATA_ADDRESSES:
        return "metadata address"
    if address in LINK_LOCAL_V4 or address.is_link_local:
        return "link-local address"
    return None


def refusal(url: str) -> str | None:
    """Why a URL must not be fetched, or None: 'scheme <name>', 'no scheme', or host_refusal's reason."""
    if re.match(_WEB, url) is None:
        scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", url)
        return f"scheme {scheme[1].lower()}" if scheme else "no scheme"
    return host_refusal(re.split(r"[/?#]", url.split("://", 1)[1], maxsplit=1)[0])


def web_mask(urls: pa.Array | pa.ChunkedArray, refused: Counter[str] | None) -> pa.BooleanArray:
    """Rows whose URL may be fetched (null URLs are kept: img2dataset counts them as failed downloads).

    Vectorized for the usual row (a lower-case http(s) URL with a plain host name); only the rest, rare
    in real data (placeholders, other schemes or casing, hosts that may spell an address), is looked
    at in Python. `refused` counts each dropped row by reason.
    """
    urls = pc.cast(urls, pa.string())
    web = pc.or_(pc.starts_with(urls, "http://"), pc.starts_with(urls, "https://"))  # 10x a regex's speed
    keep = pc.fill_null(pc.and_(web, pc.invert(pc.match_substring_regex(urls, _SUSPECT_HOST))), True)
    if pc.all(keep).as_py():
        return keep
    verdicts = keep.to_pylist()
    for i in pc.indices_nonzero(pc.invert(keep)).to_pylist():
        url = urls[i].as_py()
        reason = None if re.match(PLACEHOLDER, url) else refusal(url)
        verdicts[i] = reason is None
        if reason is not None and refused is not None:
            refused[reason] += 1
    return pa.array(verdicts, type=pa.bool_())


def describe(refused: dict[str, int]) -> str:
    """`3 non-web URLs refused (scheme file 2, metadata address 1)`, or '' when none were."""
    total = sum(refused.values())
    if not total:
        return ""
    parts = ", ".join(
        f"{reason} {n:,}" for reason, n in sorted(refused.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    return f"{total:,} non-web URL(s) refused ({parts})"
