//! The trust policy: which keys may sign which toolkits in which tiers, and whether a tier
//! without such a signature is left out (`require`) or served with a warning (`warn`). A TOML
//! file named by `CLOUD_HARNESS_TRUST_POLICY` (`trust.policy`), read when the server starts;
//! without one, nothing is checked.
//!
//! ```toml
//! [[scope]]
//! name = "acme"                                  # shown in warnings (default: its number)
//! toolkits = ["https://github.com/acme/*"]       # repository URLs; `*` is any run of characters
//!                                                # (`["*"]`: every toolkit)
//! tiers = ["owner", "workspace"]                 # default: both
//! keys = ["ssh-ed25519 AAAAC3Nza… release@acme"] # Ed25519 public keys, OpenSSH lines
//! mode = "require"                               # or "warn"
//! ```
//!
//! Every scope that matches a toolkit and tier applies, each on its own: a tier is served
//! when each of them finds a good signature by one of its keys (see `verdict`).

use super::{canonical, check_tier, parse_key};
use cloud_harness_error::{Code, Error, Result};
use serde::{Deserialize, Serialize};
use ssh_key::PublicKey;
use std::io::Read;
use std::path::Path;

/// The largest policy file read.
const MAX_FILE: u64 = 1024 * 1024;
const MAX_SCOPES: usize = 256;
/// Keys, and URL patterns, one scope may name.
const MAX_PER_SCOPE: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Require,
    Warn,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Require => "require",
            Mode::Warn => "warn",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Scope {
    pub name: String,
    toolkits: Vec<glob::Pattern>,
    tiers: Vec<&'static str>,
    pub keys: Vec<PublicKey>,
    pub mode: Mode,
}

impl Scope {
    /// Whether this scope speaks for the toolkit at `url` (spelled [`canonical`]ly) served
    /// in `tier`: its patterns match case-insensitively (a spelling the host takes as the same
    /// repository is covered the same; where a host tells paths apart by case, a pattern
    /// covers more, never less).
    fn covers(&self, url: &str, tier: &str) -> bool {
        let options = glob::MatchOptions {
            case_sensitive: false,
            ..glob::MatchOptions::new()
        };
        self.tiers.contains(&tier) && self.toolkits.iter().any(|p| p.matches_with(url, options))
    }

    /// Whether `key` is one this scope trusts (its key data; a comment is no part of it).
    pub fn trusts(&self, key: &PublicKey) -> bool {
        self.keys.iter().any(|k| k.key_data() == key.key_data())
    }
}

/// The whole policy; the default one has no scope and checks nothing.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub scopes: Vec<Scope>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    scope: Vec<ScopeFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScopeFile {
    name: Option<String>,
    toolkits: Vec<String>,
    tiers: Option<Vec<String>>,
    keys: Vec<String>,
    mode: Mode,
}

impl Policy {
    /// The policy `CLOUD_HARNESS_TRUST_POLICY` names, or none.
    pub fn from_env() -> Result<Policy> {
        match std::env::var_os("CLOUD_HARNESS_TRUST_POLICY") {
            Some(p) if !p.is_empty() => Policy::read(Path::new(&p)),
            _ => Ok(Policy::default()),
        }
    }

    pub fn read(path: &Path) -> Result<Policy> {
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_FILE + 1).read_to_string(&mut text))
            .map_err(|e| Error::io(path, e))?;
        if text.len() as u64 > MAX_FILE {
            return Err(Error::new(
                Code::InvalidArgument,
                format!(
                    "the trust policy {} is more than {MAX_FILE} bytes",
                    path.display()
                ),
            ));
        }
        Policy::parse(&text).map_err(|e| {
            Error::new(
                Code::InvalidArgument,
                format!("the trust policy {}: {}", path.display(), e.message),
            )
            .with_details(e.details)
        })
    }

    pub fn parse(text: &str) -> Result<Policy> {
        let file: File = toml::from_str(text)
            .map_err(|e| Error::new(Code::InvalidArgument, e.message().to_owned()))?;
        if file.scope.len() > MAX_SCOPES {
            return Err(Error::new(
                Code::InvalidArgument,
                format!("{} scopes, more than {MAX_SCOPES}", file.scope.len()),
            ));
        }
        let scopes = file
            .scope
            .into_iter()
            .enumerate()
            .map(|(i, s)| scope(i, s))
            .collect::<Result<_>>()?;
        Ok(Policy { scopes })
    }

    /// The scopes that speak for the toolkit at `url` served in `tier`.
    /// (The URL is spelled [`canonical`]ly once, not once a scope.)
    pub fn covering<'a>(&'a self, url: &'a str, tier: &'a str) -> impl Iterator<Item = &'a Scope> {
        let url = canonical(url);
        self.scopes.iter().filter(move |s| s.covers(&url, tier))
    }

    pub fn is_empty(&self) -> bool {
        self.scopes.is_empty()
    }
}

fn scope(i: usize, s: ScopeFile) -> Result<Scope> {
    let name = s.name.unwrap_or_else(|| format!("scope {}", i + 1));
    let bad = |why: String| Error::new(Code::InvalidArgument, format!("{name}: {why}"));
    if s.keys.is_empty() || s.toolkits.is_empty() {
        return Err(bad("names no key or no toolkit".into()));
    }
    if s.keys.len() > MAX_PER_SCOPE || s.toolkits.len() > MAX_PER_SCOPE {
        return Err(bad(format!("more than {MAX_PER_SCOPE} keys or toolkits")));
    }
    // A pattern is spelled as the URLs it matches are (see `canonical`): without a trailing
    // `/` or `.git`.
    let toolkits = s
        .toolkits
        .iter()
        .map(|t| {
            let spelled = t.trim_end_matches('/');
            let spelled = spelled.strip_suffix(".git").unwrap_or(spelled);
            glob::Pattern::new(spelled).map_err(|e| bad(format!("toolkits: {t:?}: {e}")))
        })
        .collect::<Result<_>>()?;
    let tiers = match s.tiers {
        None => super::TIERS.to_vec(),
        Some(t) if t.is_empty() => return Err(bad("names no tier".into())),
        Some(t) => t
            .iter()
            .map(|t| check_tier(t).map_err(|e| bad(format!("tiers: {t:?}: {}", e.message))))
            .collect::<Result<_>>()?,
    };
    let keys = s
        .keys
        .iter()
        .map(|k| parse_key(k).map_err(|e| bad(e.message)))
        .collect::<Result<_>>()?;
    Ok(Scope {
        name,
        toolkits,
        tiers,
        keys,
        mode: s.mode,
    })
}
