//! What the egress proxy lets through, and its judgement of one request head.
//!
//! HTTP `CONNECT` only (anything else: 405), to hosts on the allowlist and their allowed port
//! (443 unless the allowlist names another), names compared after lower-casing, trailing-dot
//! removal and IDNA. Each name is resolved once (or pinned with `CLOUD_HARNESS_RESOLVE`); every
//! address is classified, and one special-purpose address (loopback, private, link-local,
//! CGNAT, multicast, reserved, the IPv6 forms that embed IPv4, …) refuses the request unless
//! `CLOUD_HARNESS_ALLOW_CIDRS` opens its range. The verdict names exactly the address to dial.

use cloud_harness_control::hosts::{normalize_host, HostPolicy};
use cloud_harness_error::{Error, Result};
use ipnet::IpNet;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;

/// Why an address may not be dialled, or `None` for a public one.
pub fn classify(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "\"this network\" 0.0.0.0/8",
        (10, _, _) => "private (RFC 1918) 10.0.0.0/8",
        (100, 64..=127, _) => "shared address space (CGNAT) 100.64.0.0/10",
        (127, _, _) => "loopback 127.0.0.0/8",
        (169, 254, _) => "link-local 169.254.0.0/16 (cloud metadata lives here)",
        (172, 16..=31, _) => "private (RFC 1918) 172.16.0.0/12",
        (192, 0, 0) => "IETF protocol assignments 192.0.0.0/24",
        (192, 0, 2) => "documentation 192.0.2.0/24",
        (192, 88, 99) => "6to4 relay anycast 192.88.99.0/24",
        (192, 168, _) => "private (RFC 1918) 192.168.0.0/16",
        (198, 18..=19, _) => "benchmarking 198.18.0.0/15",
        (198, 51, 100) => "documentation 198.51.100.0/24",
        (203, 0, 113) => "documentation 203.0.113.0/24",
        (224..=239, _, _) => "multicast 224.0.0.0/4",
        (240..=255, _, _) => "reserved 240.0.0.0/4 (and broadcast)",
        _ => return None,
    })
}

fn classify_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some("unspecified ::/128");
    }
    if ip.is_loopback() {
        return Some("loopback ::1");
    }
    // IPv4-mapped (::ffff:a.b.c.d) and IPv4-compatible (::a.b.c.d) forms are judged by the
    // IPv4 address they carry.
    if s[..5] == [0, 0, 0, 0, 0] && (s[5] == 0xffff || s[5] == 0) {
        let [.., a, b, c, d] = ip.octets();
        return classify_v4(Ipv4Addr::new(a, b, c, d)).map(|_| {
            if s[5] == 0xffff {
                "IPv4-mapped IPv6 of a special-purpose IPv4 address"
            } else {
                "IPv4-compatible IPv6 of a special-purpose IPv4 address"
            }
        });
    }
    Some(match s[0] {
        0x64 if s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] => "NAT64 64:ff9b::/96",
        0x64 if s[1] == 0xff9b && s[2] == 1 => "local-use NAT64 64:ff9b:1::/48",
        0x100 if s[1..4] == [0, 0, 0] => "discard-only 100::/64",
        0x2001 if s[1] == 0 => "Teredo 2001::/32",
        0x2001 if s[1] & 0xfff0 == 0x10 || s[1] & 0xfff0 == 0x20 => {
            "ORCHID 2001:10::/28, 2001:20::/28"
        }
        0x2001 if s[1] < 0x200 => "IETF protocol assignments 2001::/23",
        0x2001 if s[1] == 0xdb8 => "documentation 2001:db8::/32",
        0x2002 => "6to4 2002::/16",
        0x3fff if s[1] < 0x1000 => "documentation 3fff::/20",
        0x5f00 => "segment routing 5f00::/16",
        x if x & 0xfe00 == 0xfc00 => "unique local fc00::/7",
        x if x & 0xffc0 == 0xfe80 => "link-local fe80::/10",
        x if x & 0xffc0 == 0xfec0 => "site-local fec0::/10",
        x if x & 0xff00 == 0xff00 => "multicast ff00::/8",
        _ => return None,
    })
}

/// Resolves names; swapped for scripted resolvers in tests.
pub trait Resolve: Send + Sync + 'static {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>>;
}

/// The system resolver.
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>> {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host, port))
                .await?
                .map(|a| a.ip())
                .collect())
        })
    }
}

/// What the proxy lets through.
#[derive(Debug, Clone)]
pub struct EgressPolicy {
    pub hosts: HostPolicy,
    /// Ranges opened despite being special-purpose (`CLOUD_HARNESS_ALLOW_CIDRS`).
    pub allow_cidrs: Vec<IpNet>,
    /// `host=address` pins (`CLOUD_HARNESS_RESOLVE`), like curl's `--resolve`.
    pub pins: HashMap<String, Vec<IpAddr>>,
}

impl EgressPolicy {
    /// The same exceptions (ranges, pins) for another allowlist: an executor's egress.
    pub fn with_hosts(&self, hosts: HostPolicy) -> EgressPolicy {
        EgressPolicy {
            hosts,
            ..self.clone()
        }
    }

    /// The environment a `cloud-harness proxy` process (a proxy container) needs to apply
    /// this policy.
    pub fn proxy_env(&self) -> Vec<String> {
        let pins: Vec<String> = self
            .pins
            .iter()
            .flat_map(|(h, addrs)| addrs.iter().map(move |a| format!("{h}={a}")))
            .collect();
        let cidrs: Vec<String> = self.allow_cidrs.iter().map(ToString::to_string).collect();
        vec![
            format!("ALLOWED_GIT_HOSTS={}", self.hosts.allowlist()),
            format!("CLOUD_HARNESS_ALLOW_CIDRS={}", cidrs.join(",")),
            format!("CLOUD_HARNESS_RESOLVE={}", pins.join(",")),
            "RUST_LOG=egress=info".into(),
        ]
    }

    pub fn from_env(hosts: HostPolicy) -> Result<EgressPolicy> {
        let cidrs = std::env::var("CLOUD_HARNESS_ALLOW_CIDRS").unwrap_or_default();
        let pins = std::env::var("CLOUD_HARNESS_RESOLVE").unwrap_or_default();
        EgressPolicy::new(hosts, &cidrs, &pins)
    }

    pub fn new(hosts: HostPolicy, cidrs: &str, pins: &str) -> Result<EgressPolicy> {
        let mut allow_cidrs = Vec::new();
        for c in cidrs.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            let net = c
                .parse::<IpNet>()
                .or_else(|_| c.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    Error::invalid(format!(
                        "CLOUD_HARNESS_ALLOW_CIDRS: {c:?} is not a CIDR range"
                    ))
                })?;
            allow_cidrs.push(net);
        }
        let mut map: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for pair in pins.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (host, addr) = pair.split_once('=').ok_or_else(|| {
                Error::invalid(format!(
                    "CLOUD_HARNESS_RESOLVE: {pair:?} is not host=address"
                ))
            })?;
            let addr = addr
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .map_err(|_| {
                    Error::invalid(format!("CLOUD_HARNESS_RESOLVE: {addr:?} is not an address"))
                })?;
            let host = normalize_host(host).ok_or_else(|| {
                Error::invalid(format!("CLOUD_HARNESS_RESOLVE: bad host {host:?}"))
            })?;
            map.entry(host).or_default().push(addr);
        }
        Ok(EgressPolicy {
            hosts,
            allow_cidrs,
            pins: map,
        })
    }

    fn refused_address(&self, ip: IpAddr) -> Option<&'static str> {
        let class = classify(ip)?;
        (!self.allow_cidrs.iter().any(|net| net.contains(&ip))).then_some(class)
    }
}

/// The proxy's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Dial exactly this address.
    Allow(SocketAddr),
    /// Refuse with this HTTP status and reason.
    Refuse(u16, String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub host: String,
    pub port: u16,
    pub addresses: Vec<IpAddr>,
    pub verdict: Verdict,
}

fn refuse(
    host: &str,
    port: u16,
    addresses: Vec<IpAddr>,
    status: u16,
    reason: impl Into<String>,
) -> Decision {
    Decision {
        host: host.to_owned(),
        port,
        addresses,
        verdict: Verdict::Refuse(status, reason.into()),
    }
}

/// Judges a request head (everything up to the blank line).
pub async fn decide(policy: &EgressPolicy, resolver: &dyn Resolve, head: &str) -> Decision {
    let line = head.lines().next().unwrap_or("");
    // Exactly `METHOD SP target SP HTTP/1.x`: nothing before the method, one space between.
    let mut parts = line.splitn(3, ' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let version = parts.next().unwrap_or("");
    let well_formed = version.starts_with("HTTP/1.") && !version.contains(' ');
    if method == "CONNECT" && !well_formed {
        return refuse(
            target,
            0,
            vec![],
            400,
            "the request line must be `CONNECT host:port HTTP/1.1`",
        );
    }
    if method != "CONNECT" {
        return refuse(
            target,
            0,
            vec![],
            405,
            format!("only CONNECT is allowed, not {method:?}"),
        );
    }
    if target.contains('@') || target.contains('/') {
        return refuse(
            target,
            0,
            vec![],
            403,
            "the target must be host:port, without credentials or a path",
        );
    }
    let Some((raw_host, raw_port)) = target.rsplit_once(':').filter(|(h, _)| !h.is_empty()) else {
        return refuse(target, 0, vec![], 400, "the target must be host:port");
    };
    let Ok(port) = raw_port.parse::<u16>() else {
        return refuse(raw_host, 0, vec![], 400, format!("bad port {raw_port:?}"));
    };
    let bare = raw_host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(raw_host);
    let Some(host) = normalize_host(raw_host).or_else(|| normalize_host(bare)) else {
        return refuse(raw_host, port, vec![], 400, "not a host name");
    };
    // An address literal (in any of the forms URL parsers accept) is judged as an address,
    // and is never on the allowlist of names.
    let literal = url::Host::parse(&host).ok().and_then(|h| match h {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        url::Host::Domain(_) => bare.parse::<IpAddr>().ok(),
    });
    if let Some(ip) = literal {
        let why = match classify(ip) {
            Some(class) => format!("address literal {ip}: {class}"),
            None => format!("address literal {ip} is not on the allowlist of names"),
        };
        return refuse(&host, port, vec![ip], 403, why);
    }
    if !policy.hosts.allows(&host, port) {
        return refuse(
            &host,
            port,
            vec![],
            403,
            format!("{host}:{port} is not on the allowlist"),
        );
    }
    let addresses = match policy.pins.get(&host) {
        Some(pinned) => pinned.clone(),
        None => match resolver.resolve(&host, port).await {
            Ok(a) if !a.is_empty() => a,
            Ok(_) => return refuse(&host, port, vec![], 502, "the name has no address"),
            Err(e) => return refuse(&host, port, vec![], 502, format!("resolving failed: {e}")),
        },
    };
    if let Some((ip, class)) = addresses
        .iter()
        .find_map(|ip| policy.refused_address(*ip).map(|c| (*ip, c)))
    {
        return refuse(
            &host,
            port,
            addresses,
            403,
            format!("{host} resolves to {ip}: {class}"),
        );
    }
    let chosen = SocketAddr::new(addresses[0], port);
    Decision {
        host,
        port,
        addresses,
        verdict: Verdict::Allow(chosen),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_purpose_ranges() {
        for bad in [
            "0.1.2.3",
            "10.1.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.0.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.1",
            "203.0.113.1",
            "224.0.0.1",
            "239.255.255.255",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "100::1",
            "2001::1",
            "2001:db8::1",
            "2001:10::1",
            "2002:a9fe:a9fe::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(
                classify(bad.parse().unwrap()).is_some(),
                "{bad} should be special-purpose"
            );
        }
        for good in [
            "8.8.8.8",
            "140.82.112.3",
            "100.63.255.255",
            "100.128.0.1",
            "172.32.0.1",
            "2606:4700::1111",
            "2a00:1450::1",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(classify(good.parse().unwrap()), None, "{good} is public");
        }
    }
}

#[cfg(test)]
mod request_line {
    use super::*;

    /// Answers every name with a public address: only the request line decides here.
    struct Public;

    impl Resolve for Public {
        fn resolve<'a>(
            &'a self,
            _host: &'a str,
            _port: u16,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>,
        > {
            Box::pin(std::future::ready(Ok(vec!["140.82.112.3"
                .parse()
                .unwrap()])))
        }
    }

    fn verdict(head: &str) -> bool {
        let policy = EgressPolicy::new(
            cloud_harness_control::hosts::HostPolicy::new("github.com", "").unwrap(),
            "",
            "",
        )
        .unwrap();
        let decided = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(decide(&policy, &Public, head));
        matches!(decided.verdict, Verdict::Allow(_))
    }

    /// Found by fuzzing: a request line that does not start with its method was let through.
    #[test]
    fn only_a_well_formed_connect_line_is_let_through() {
        assert!(verdict(
            "CONNECT github.com:443 HTTP/1.1\r\nHost: github.com:443\r\n\r\n"
        ));
        for bad in [
            " CONNECT github.com:443 HTTP/1.1\r\n\r\n",
            "CONNECT  github.com:443 HTTP/1.1\r\n\r\n",
            "CONNECT github.com:443\r\n\r\n",
            "CONNECT github.com:443 HT\u{498}NECT x\r\n\r\n",
            "CONNECT github.com:443 HTTP/1.1 extra\r\n\r\n",
        ] {
            assert!(!verdict(bad), "{bad:?} was let through");
        }
    }
}
