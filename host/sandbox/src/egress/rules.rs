//! What a request may reach: hosts and the allow-list (canonical names and IP literals
//! only), the address classes refused after DNS (loopback, private, link-local, CGNAT,
//! documentation, multicast, reserved, with IPv4 embedded in IPv6 forms), and the
//! headers a guest may not set.

use super::*;

// ---------------------------------------------------------------------------------------
// Hosts and the allow-list
// ---------------------------------------------------------------------------------------

/// A request's host, as it will be connected to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Host {
    /// A valid DNS name, lowercase, without a trailing dot.
    Name(String),
    Ip(IpAddr),
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// Parses the host of a URL authority the strict way: a bracketed IPv6 literal (no zone),
/// a canonical dotted-quad IPv4 literal, or a DNS name whose last label is not numeric.
/// Everything a resolver might read as a number in another spelling (`2130706433`,
/// `0177.0.0.1`, `0x7f.1`, `127.1`) is refused rather than interpreted.
pub(crate) fn parse_host(raw: &str) -> Result<Host, String> {
    if let Some(inner) = raw.strip_prefix('[') {
        return inner
            .strip_suffix(']')
            .and_then(|ip| ip.parse::<Ipv6Addr>().ok())
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .ok_or_else(|| format!("{raw:?} is not a valid IPv6 address"));
    }
    let lower = raw.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    // std's parser takes exactly four decimal parts without leading zeros.
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(ip)));
    }
    check_dns_name(name).map_err(|why| format!("{raw:?} is not a valid host name: {why}"))?;
    Ok(Host::Name(name.to_owned()))
}

pub(crate) fn check_dns_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("a name has 1 to 253 characters");
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() || label.len() > 63 {
            return Err("each dot-separated label has 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("only letters, digits, '-' and '_' (IDNs in punycode)");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label does not start or end with '-'");
        }
    }
    // URL parsers (WHATWG) read a host whose last label is numeric as an IPv4 address in
    // some spelling; so do resolvers. Only the canonical dotted quad is an IP here.
    let last = labels[labels.len() - 1];
    let hex = last
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    if last.bytes().all(|b| b.is_ascii_digit()) || hex {
        return Err("it ends in a number, like a non-canonical IPv4 address");
    }
    Ok(())
}

/// One allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pattern {
    Exact(Host),
    /// `*.domain`: strict subdomains of `domain`.
    Subdomains(String),
}

impl Pattern {
    pub(crate) fn parse(raw: &str) -> Result<Pattern, String> {
        let s = raw.trim();
        let bad = |why: &str| Err(format!("invalid allow_hosts entry {raw:?}: {why}"));
        if s.is_empty() {
            return bad("it is empty");
        }
        if s.contains("://") || s.contains('/') {
            return bad("give a host name, not a URL");
        }
        if let Some(domain) = s.strip_prefix("*.") {
            if domain.contains('*') {
                return bad("'*' only as the whole first label, as in *.example.com");
            }
            return match parse_host(domain) {
                Ok(Host::Name(d)) => Ok(Pattern::Subdomains(d)),
                Ok(Host::Ip(_)) => bad("a wildcard needs a domain name, not an IP address"),
                Err(e) => bad(&e),
            };
        }
        if s.contains('*') {
            return bad("'*' only as the whole first label, as in *.example.com");
        }
        // A bare IPv6 address is accepted too: there is no port to confuse it with.
        if let Ok(ip) = s.parse::<Ipv6Addr>() {
            return Ok(Pattern::Exact(Host::Ip(IpAddr::V6(ip))));
        }
        if !s.starts_with('[') && s.contains(':') {
            return bad("no ports: the allow-list names hosts, any port is allowed");
        }
        parse_host(s).map(Pattern::Exact).or_else(|e| bad(&e))
    }

    pub(crate) fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (Pattern::Exact(h), host) => h == host,
            (Pattern::Subdomains(domain), Host::Name(name)) => name
                .strip_suffix(domain.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (Pattern::Subdomains(_), Host::Ip(_)) => false,
        }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Exact(h) => write!(f, "{h}"),
            Pattern::Subdomains(d) => write!(f, "*.{d}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The address classifier
// ---------------------------------------------------------------------------------------

/// What an address is, for egress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Publicly routable: may be connected to.
    Global,
    /// 127.0.0.0/8, ::1, or an IPv4-mapped loopback: only with `allow_loopback_egress`.
    Loopback,
    /// Never connected to; the reason names the range.
    Forbidden(&'static str),
}

/// IPv4 ranges that are not globally reachable (IANA special-purpose registry), besides
/// loopback.
pub(crate) const V4_FORBIDDEN: &[([u8; 4], u32, &str)] = &[
    ([0, 0, 0, 0], 8, "a \"this network\" address (0.0.0.0/8)"),
    ([10, 0, 0, 0], 8, "a private address (10.0.0.0/8)"),
    (
        [100, 64, 0, 0],
        10,
        "a carrier-grade NAT address (100.64.0.0/10)",
    ),
    (
        [169, 254, 0, 0],
        16,
        "a link-local address (169.254.0.0/16, cloud metadata)",
    ),
    ([172, 16, 0, 0], 12, "a private address (172.16.0.0/12)"),
    (
        [192, 0, 0, 0],
        24,
        "an IETF protocol address (192.0.0.0/24)",
    ),
    ([192, 0, 2, 0], 24, "a documentation address (192.0.2.0/24)"),
    (
        [192, 88, 99, 0],
        24,
        "a 6to4 relay address (192.88.99.0/24)",
    ),
    ([192, 168, 0, 0], 16, "a private address (192.168.0.0/16)"),
    (
        [198, 18, 0, 0],
        15,
        "a benchmarking address (198.18.0.0/15)",
    ),
    (
        [198, 51, 100, 0],
        24,
        "a documentation address (198.51.100.0/24)",
    ),
    (
        [203, 0, 113, 0],
        24,
        "a documentation address (203.0.113.0/24)",
    ),
    ([224, 0, 0, 0], 4, "a multicast address (224.0.0.0/4)"),
    (
        [240, 0, 0, 0],
        4,
        "a reserved or broadcast address (240.0.0.0/4)",
    ),
];

/// IPv6 ranges refused outright, checked after the forms that embed IPv4.
pub(crate) const V6_FORBIDDEN: &[([u16; 2], u32, &str)] = &[
    (
        [0x0064, 0xff9b],
        48,
        "a local-use NAT64 address (64:ff9b:1::/48)",
    ),
    ([0x0100, 0], 64, "a discard-only address (100::/64)"),
    (
        [0x2001, 0],
        23,
        "an IETF protocol address (2001::/23, incl. Teredo)",
    ),
    (
        [0x2001, 0x0db8],
        32,
        "a documentation address (2001:db8::/32)",
    ),
    ([0x3fff, 0], 20, "a documentation address (3fff::/20)"),
    ([0x5f00, 0], 16, "a segment-routing address (5f00::/16)"),
    ([0xfc00, 0], 7, "a unique local address (fc00::/7)"),
    ([0xfe80, 0], 10, "a link-local address (fe80::/10)"),
    ([0xfec0, 0], 10, "a site-local address (fec0::/10)"),
    ([0xff00, 0], 8, "a multicast address (ff00::/8)"),
];

pub(crate) fn in_v4(ip: Ipv4Addr, net: [u8; 4], len: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(ip) & mask == u32::from_be_bytes(net) & mask
}

pub(crate) fn in_v6(ip: Ipv6Addr, net: [u16; 2], len: u32) -> bool {
    let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
    let net = (u128::from(net[0]) << 112) | (u128::from(net[1]) << 96);
    u128::from(ip) & mask == net & mask
}

pub(crate) fn classify(ip: IpAddr) -> Class {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

pub(crate) fn classify_v4(ip: Ipv4Addr) -> Class {
    if ip.octets()[0] == 127 {
        return Class::Loopback;
    }
    match V4_FORBIDDEN
        .iter()
        .find(|(net, len, _)| in_v4(ip, *net, *len))
    {
        Some((_, _, why)) => Class::Forbidden(why),
        None => Class::Global,
    }
}

pub(crate) fn classify_v6(ip: Ipv6Addr) -> Class {
    let bits = u128::from(ip);
    // ::ffff:a.b.c.d is the IPv4 address itself to a dual-stack socket.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return match classify_v4(v4) {
            Class::Forbidden(_) => Class::Forbidden("an IPv4-mapped form of a forbidden address"),
            other => other,
        };
    }
    if ip == Ipv6Addr::LOCALHOST {
        return Class::Loopback;
    }
    if ip.is_unspecified() {
        return Class::Forbidden("the unspecified address (::)");
    }
    if bits >> 32 == 0 {
        return Class::Forbidden("an IPv4-compatible address (::/96, deprecated)");
    }
    // NAT64 (64:ff9b::/96): reaches the embedded IPv4 address through a translator.
    if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
        let v4 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
        return match classify_v4(v4) {
            Class::Global => Class::Global,
            _ => Class::Forbidden("a NAT64 form of a forbidden IPv4 address (64:ff9b::/96)"),
        };
    }
    // 6to4 (2002::/16): reaches the IPv4 address in bits 16..48 through a relay.
    if bits >> 112 == 0x2002 {
        let v4 = Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32);
        if classify_v4(v4) != Class::Global {
            return Class::Forbidden("a 6to4 form of a forbidden IPv4 address (2002::/16)");
        }
        return Class::Global;
    }
    if let Some((_, _, why)) = V6_FORBIDDEN
        .iter()
        .find(|(net, len, _)| in_v6(ip, *net, *len))
    {
        return Class::Forbidden(why);
    }
    // Only 2000::/3 is allocated for global unicast; the rest is reserved.
    if bits >> 125 != 0b001 {
        return Class::Forbidden("a reserved address (outside 2000::/3)");
    }
    Class::Global
}

/// Every address a host resolved to must pass: one public A record next to a private
/// AAAA record is refused, not connected to the "good" one.
pub(crate) fn check_addresses(
    host: &Host,
    addrs: &[SocketAddr],
    allow_loopback: bool,
) -> Result<(), String> {
    for a in addrs {
        if let Err(why) = check_address(a.ip(), allow_loopback) {
            return Err(match host {
                Host::Name(name) => format!("{name} resolves to {}, {why}", a.ip()),
                Host::Ip(ip) => format!("{ip} is {why}"),
            });
        }
    }
    Ok(())
}

/// `Err(reason)` when egress to `ip` is refused.
pub(crate) fn check_address(ip: IpAddr, allow_loopback: bool) -> Result<(), &'static str> {
    match classify(ip) {
        Class::Global => Ok(()),
        Class::Loopback if allow_loopback => Ok(()),
        Class::Loopback => Err("a loopback address"),
        Class::Forbidden(why) => Err(why),
    }
}

// ---------------------------------------------------------------------------------------
// Headers
// ---------------------------------------------------------------------------------------

/// Request headers a guest may not set. wasi-http's defaults (hop-by-hop headers, `host`,
/// `proxy-authorization`, ...) plus every `proxy-*` header, `te` and `trailer`
/// (hop-by-hop), `expect`, and the headers proxies use to tell a server who the client is
/// (`forwarded`, `x-forwarded-*`, `x-real-ip`, `via`), which a server behind a proxy may
/// trust. Setting one fails at `fields.set`/`append`/`from-list` with
/// `header-error.forbidden`; a request that carries one anyway is refused.
pub(crate) fn is_forbidden_header(name: &HeaderName) -> bool {
    let n = name.as_str();
    wasmtime_wasi_http::DEFAULT_FORBIDDEN_HEADERS.contains(name)
        || n.starts_with("proxy-")
        || n.starts_with("x-forwarded-")
        || matches!(
            n,
            "te" | "trailer" | "expect" | "forwarded" | "x-real-ip" | "via"
        )
}
