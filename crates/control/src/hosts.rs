//! Which git URLs may be fetched: HTTPS only, hosts on `ALLOWED_GIT_HOSTS`, after the
//! `CLOUD_HARNESS_URL_REWRITE` mirrors are applied (the allowlist judges the URL actually
//! fetched).

use cloud_harness_error::{Code, Error, Result};

/// One allowlist entry: `host` (port 443), `host:port`, or `*.suffix` (any subdomain, 443).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Allowed {
    host: String,
    port: u16,
    subdomains: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPolicy {
    /// The allowlist as configured, to hand on (to the proxy of helper containers).
    source: String,
    allowed: Vec<Allowed>,
    /// `FROM=TO` prefix rewrites, longest `FROM` first, like git's `url.<TO>.insteadOf=<FROM>`.
    rewrites: Vec<(String, String)>,
}

/// A host as the allowlist and the egress proxy both compare it: lower-case, IDNA to ASCII,
/// one trailing dot dropped; an address literal in its canonical form (IPv6 in brackets).
/// `None` for what is not a host.
pub fn normalize_host(host: &str) -> Option<String> {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.ends_with('.') {
        return None;
    }
    Some(
        url::Host::parse(host)
            .ok()?
            .to_string()
            .to_ascii_lowercase(),
    )
}

impl HostPolicy {
    /// `ALLOWED_GIT_HOSTS` (comma-separated, default `github.com`) and
    /// `CLOUD_HARNESS_URL_REWRITE` (`FROM=TO` pairs, comma-separated).
    pub fn from_env() -> Result<HostPolicy> {
        let hosts = std::env::var("ALLOWED_GIT_HOSTS").unwrap_or_else(|_| "github.com".into());
        let rewrites = std::env::var("CLOUD_HARNESS_URL_REWRITE").unwrap_or_default();
        HostPolicy::new(&hosts, &rewrites)
    }

    pub fn new(hosts: &str, rewrites: &str) -> Result<HostPolicy> {
        let config = |what: String| Error::new(Code::InvalidArgument, what);
        let mut allowed = Vec::new();
        for entry in hosts.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (pattern, port) = match entry.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') || h.ends_with(']') => (
                    h,
                    p.parse::<u16>()
                        .map_err(|_| config(format!("ALLOWED_GIT_HOSTS: bad port in {entry:?}")))?,
                ),
                _ => (entry, 443),
            };
            let (subdomains, host) = match pattern.strip_prefix("*.") {
                Some(rest) => (true, rest),
                None => (false, pattern),
            };
            let host = normalize_host(host)
                .ok_or_else(|| config(format!("ALLOWED_GIT_HOSTS: bad host in {entry:?}")))?;
            allowed.push(Allowed {
                host,
                port,
                subdomains,
            });
        }
        let mut pairs = Vec::new();
        for pair in rewrites.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (from, to) = pair.split_once('=').ok_or_else(|| {
                config(format!(
                    "CLOUD_HARNESS_URL_REWRITE: {pair:?} is not FROM=TO"
                ))
            })?;
            pairs.push((from.to_owned(), to.to_owned()));
        }
        pairs.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        Ok(HostPolicy {
            source: hosts.to_owned(),
            allowed,
            rewrites: pairs,
        })
    }

    /// The allowlist in `ALLOWED_GIT_HOSTS` form.
    pub fn allowlist(&self) -> &str {
        &self.source
    }

    /// The URL that is fetched for `url`: the longest matching rewrite applied.
    pub fn rewrite(&self, url: &str) -> String {
        for (from, to) in &self.rewrites {
            if let Some(rest) = url.strip_prefix(from.as_str()) {
                return format!("{to}{rest}");
            }
        }
        url.to_owned()
    }

    /// Whether `host` (normalized) on `port` is on the allowlist.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        self.allowed.iter().any(|a| {
            let name_matches = if a.subdomains {
                // `*.corp.example`: a subdomain, not the name itself.
                host.strip_suffix(a.host.as_str())
                    .is_some_and(|p| p.len() > 1 && p.ends_with('.'))
            } else {
                a.host == host
            };
            a.port == port && name_matches
        })
    }

    /// Checks `url` (the spec's field `field`) and the URL it is rewritten to; returns the
    /// latter. Not HTTPS, credentials, queries: INVALID_ARGUMENT. A host off the allowlist:
    /// FORBIDDEN.
    pub fn check(&self, url: &str, field: &str) -> Result<String> {
        check_shape(url, field)?;
        let fetched = self.rewrite(url);
        let parsed = check_shape(&fetched, field)?;
        let host = parsed
            .host_str()
            .and_then(normalize_host)
            .ok_or_else(|| Error::field(Code::InvalidArgument, field, "the URL has no host"))?;
        let port = parsed.port_or_known_default().unwrap_or(443);
        if !self.allows(&host, port) {
            let via = if fetched != url {
                format!(" (rewritten to {fetched})")
            } else {
                String::new()
            };
            return Err(Error::field(
                Code::Forbidden,
                field,
                format!("{host}:{port}{via} is not on ALLOWED_GIT_HOSTS"),
            ));
        }
        Ok(fetched)
    }
}

fn check_shape(url: &str, field: &str) -> Result<url::Url> {
    let parsed = url::Url::parse(url).map_err(|e| {
        Error::field(
            Code::InvalidArgument,
            field,
            format!("{url:?} is not a URL: {e}"),
        )
    })?;
    if parsed.scheme() != "https" {
        return Err(Error::field(
            Code::InvalidArgument,
            field,
            format!("{url:?} must use https"),
        ));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(Error::field(
            Code::InvalidArgument,
            field,
            "the URL must not carry credentials or an `@`",
        ));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(Error::field(
            Code::InvalidArgument,
            field,
            "the URL must not carry a query or a fragment",
        ));
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(p: &HostPolicy, url: &str) -> Option<Code> {
        p.check(url, "url").err().map(|e| e.code)
    }

    #[test]
    fn https_and_allowed_hosts_only() {
        let p = HostPolicy::new("github.com, git.example.org:8443, *.corp.example", "").unwrap();
        assert_eq!(code(&p, "https://github.com/obra/superpowers.git"), None);
        assert_eq!(code(&p, "https://GitHub.com./obra/superpowers.git"), None);
        assert_eq!(code(&p, "https://git.example.org:8443/x.git"), None);
        assert_eq!(code(&p, "https://a.b.corp.example/x.git"), None);
        assert_eq!(
            code(&p, "https://corp.example/x.git"),
            Some(Code::Forbidden)
        );
        assert_eq!(
            code(&p, "https://evilcorp.example/x.git"),
            Some(Code::Forbidden)
        );
        assert_eq!(
            code(&p, "https://git.example.org/x.git"),
            Some(Code::Forbidden)
        );
        assert_eq!(
            code(&p, "https://github.com:22/x.git"),
            Some(Code::Forbidden)
        );
        assert_eq!(code(&p, "https://gitlab.com/x.git"), Some(Code::Forbidden));
        assert_eq!(
            code(&p, "http://github.com/x.git"),
            Some(Code::InvalidArgument)
        );
        assert_eq!(
            code(&p, "ssh://git@github.com/x.git"),
            Some(Code::InvalidArgument)
        );
        assert_eq!(
            code(&p, "git@github.com:x/y.git"),
            Some(Code::InvalidArgument)
        );
        assert_eq!(
            code(&p, "https://github.com@evil.example/x.git"),
            Some(Code::InvalidArgument)
        );
        assert_eq!(
            code(&p, "https://github.com/x.git?a=b"),
            Some(Code::InvalidArgument)
        );
        assert_eq!(code(&p, "https://gıthub.com/x.git"), Some(Code::Forbidden));
        let err = p
            .check("https://gitlab.com/x.git", "toolkits[0].url")
            .unwrap_err();
        assert_eq!(err.details["field"], "toolkits[0].url");
    }

    #[test]
    fn the_allowlist_judges_the_rewritten_url() {
        let p = HostPolicy::new(
            "mirror.local:8443",
            "https://github.com/=https://mirror.local:8443/gh/,https://github.com/obra/=https://elsewhere.example/",
        )
        .unwrap();
        assert_eq!(
            p.check("https://github.com/mattpocock/skills.git", "url")
                .unwrap(),
            "https://mirror.local:8443/gh/mattpocock/skills.git"
        );
        // The longer prefix wins, and its target is not allowed.
        assert_eq!(
            code(&p, "https://github.com/obra/superpowers.git"),
            Some(Code::Forbidden)
        );
    }
}
