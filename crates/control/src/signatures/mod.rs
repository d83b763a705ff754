//! Signatures over a tier's root: an SSH signature (the format `ssh-keygen -Y sign` writes, in
//! the namespace [`NAMESPACE`]) by an Ed25519 key over one line-based [`message`] naming the
//! toolkit's repository, the commit, the bundle digest and the tier it is served in. SSH
//! signatures because operators and publishers already hold Ed25519 SSH keys and `ssh-keygen`
//! (git signs commits the same way); Ed25519 only, so a policy never weighs algorithms.
//!
//! A signature is third-party text (a publisher's, or the bucket's copy): it is read under
//! [`MAX_TEXT`], and believed only once it verifies against a key the trust policy names
//! (`policy`, `verdict`). `stored` keeps them in the state database.

pub mod policy;
pub mod stored;
pub mod verdict;

use cloud_harness_error::{Code, Error, Result};
pub use ssh_key::PublicKey;
use ssh_key::{Algorithm, HashAlg, SshSig};

/// The SSH signature namespace of a bundle signature: a signature made for anything else
/// (a commit, a file) never verifies as one.
pub const NAMESPACE: &str = "cloud-harness-bundle";

/// The longest signature text read (an Ed25519 one is about 300 bytes).
pub const MAX_TEXT: usize = 8 * 1024;

/// The tiers a bundle is served in, as signatures and policies name them.
pub const TIERS: &[&str] = &["owner", "workspace"];

/// What a signature names: the toolkit's repository, its commit, the bundle and the tier.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub url: &'a str,
    pub commit: &'a str,
    pub bundle: &'a str,
    pub tier: &'a str,
}

impl Subject<'_> {
    /// What is signed: the repository (its [`canonical`] URL), the commit, the bundle's
    /// full-tree digest and the tier, one per line, so no field can stand for another.
    pub fn message(&self) -> String {
        format!(
            "cloud-harness bundle signature v1\nurl {}\ncommit {}\nbundle {}\ntier {}\n",
            canonical(self.url),
            self.commit,
            self.bundle,
            self.tier
        )
    }
}

/// A repository URL as signatures and policies name it, whatever spelling fetched it: parsed
/// (tabs and newlines dropped, a default port dropped), the host as the allowlist normalizes
/// it (lowercased, no trailing dot), the path without empty segments, with unreserved
/// characters written out rather than percent-escaped, and without a trailing `.git` (in any
/// case). The path keeps its case otherwise (hosts differ on it; a policy's patterns match it
/// case-insensitively, see `policy`).
///
/// One pass can leave work for the parser of the next (a `.git` stripped off `kit.git/.`
/// only once the parser drops the `.` segment; a dot decoded from `kit%2E`), so the passes
/// repeat until the spelling stands: the canonical spelling of a canonical spelling is
/// itself. Each pass after the first only shortens it, so they end; [`MAX_PASSES`] bounds
/// them all the same.
pub fn canonical(url: &str) -> String {
    let mut spelled = canonical_pass(url);
    for _ in 1..MAX_PASSES {
        let again = canonical_pass(&spelled);
        if again == spelled {
            break;
        }
        spelled = again;
    }
    spelled
}

/// The most passes [`canonical`] makes.
const MAX_PASSES: usize = 8;

fn canonical_pass(url: &str) -> String {
    let url: String = url.chars().filter(|c| !c.is_control()).collect();
    let Ok(mut parsed) = url::Url::parse(&url) else {
        // Not a URL (a toolkit's URL was checked long before): as it is, without controls.
        return url;
    };
    parsed.set_query(None);
    parsed.set_fragment(None);
    if let Some(host) = parsed.host_str().and_then(crate::hosts::normalize_host) {
        // A dot the normalization decoded (`kit%2E`) goes too: the spelling must be stable.
        let host = host.trim_end_matches('.');
        if !host.is_empty() {
            let _ = parsed.set_host(Some(host));
        }
    }
    let segments: Vec<String> = parsed
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(unescape_unreserved)
        .collect();
    let mut path = segments.join("/");
    // `kit.git/`, `kit.git.git`: every trailing `/` and `.git` goes, and a space an opaque
    // path (`hps:x `) keeps but the next parse would trim.
    loop {
        let before = path.len();
        path.truncate(path.trim_end_matches(['/', ' ']).len());
        if path.len() >= 4 && path[path.len() - 4..].eq_ignore_ascii_case(".git") {
            path.truncate(path.len() - 4);
        }
        if path.len() == before {
            break;
        }
    }
    parsed.set_path(&path);
    parsed.as_str().trim_end_matches(['/', ' ']).to_owned()
}

/// `%41` written as `A`, for the characters a URL never needs to escape (letters, digits,
/// `-`, `.`, `_`, `~`); every other escape left as it is. (A parsed URL's path is ASCII.)
fn unescape_unreserved(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = String::with_capacity(segment.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    out.push(b as char);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(bytes[i] as char);
        i += 1;
    }
    out
}

/// A tier named by a signature or a policy: `owner` or `workspace`.
pub fn check_tier(tier: &str) -> Result<&'static str> {
    TIERS.iter().copied().find(|t| *t == tier).ok_or_else(|| {
        Error::field(
            Code::InvalidArgument,
            "tier",
            "must be owner or workspace (the tiers a toolkit's bundle is served in)",
        )
    })
}

/// A signature's text, parsed: who signed, and the signature itself.
#[derive(Debug, Clone)]
pub struct Signed {
    sig: SshSig,
}

impl Signed {
    /// Parses an armored SSH signature (`-----BEGIN SSH SIGNATURE-----`): at most
    /// [`MAX_TEXT`] bytes, by an Ed25519 key, in [`NAMESPACE`].
    pub fn parse(text: &str) -> Result<Signed> {
        let bad = |why: String| Error::field(Code::InvalidArgument, "signature", why);
        if text.len() > MAX_TEXT {
            return Err(bad(format!(
                "is {} bytes, more than a signature's {MAX_TEXT}",
                text.len()
            )));
        }
        let sig = SshSig::from_pem(text.trim())
            .map_err(|e| bad(format!("is not an SSH signature ({e})")))?;
        if sig.algorithm() != Algorithm::Ed25519 {
            return Err(bad(format!(
                "is made with a {} key; only Ed25519 keys sign bundles",
                sig.algorithm()
            )));
        }
        if sig.namespace() != NAMESPACE {
            return Err(bad(format!(
                "is in the namespace {:?}, not {NAMESPACE:?} (sign with `ssh-keygen -Y sign -n {NAMESPACE}`)",
                sig.namespace()
            )));
        }
        Ok(Signed { sig })
    }

    /// The signing key, as a public key with no comment.
    pub fn key(&self) -> PublicKey {
        PublicKey::from(self.sig.public_key().clone())
    }

    /// The signing key's fingerprint, as `ssh-keygen -l` prints it (`SHA256:…`).
    pub fn fingerprint(&self) -> String {
        self.key().fingerprint(HashAlg::Sha256).to_string()
    }

    /// Whether this signs `message` (by the key it carries; whether that key is trusted is
    /// the policy's question).
    pub fn verifies(&self, message: &str) -> bool {
        self.key()
            .verify(NAMESPACE, message.as_bytes(), &self.sig)
            .is_ok()
    }
}

/// A public key a policy trusts: one OpenSSH line (`ssh-ed25519 AAAA… comment`).
pub fn parse_key(line: &str) -> Result<PublicKey> {
    let bad = |why: String| Error::field(Code::InvalidArgument, "keys", why);
    let key = PublicKey::from_openssh(line.trim())
        .map_err(|e| bad(format!("{line:?} is not an OpenSSH public key ({e})")))?;
    if key.algorithm() != Algorithm::Ed25519 {
        return Err(bad(format!(
            "{line:?} is a {} key; only Ed25519 keys sign bundles",
            key.algorithm()
        )));
    }
    Ok(key)
}

#[cfg(test)]
mod tests;
