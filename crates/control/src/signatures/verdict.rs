//! Whether a tier's root may be served: each scope of the policy that covers the toolkit and
//! tier needs a signature of exactly this bundle by one of its keys. What was verified is
//! remembered by the signature's and the message's digest, so a warm open checks a known
//! signature without its cryptography.

use super::policy::{Mode, Policy};
use super::stored::Stored;
use super::{Signed, Subject};
use cloud_harness_store::cas::{Digest, Hasher};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Verifications remembered before the memory starts again.
const REMEMBERED: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// No scope covers this toolkit and tier.
    NotRequired,
    /// Every covering scope found a good signature by one of its keys.
    Verified,
    /// No signature at all.
    Unsigned,
    /// Signatures, none by a key the scope trusts.
    UntrustedKey,
    /// A signature by a trusted key that does not sign this bundle in this tier (tampered
    /// with, or made for other bytes).
    Bad,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::NotRequired => "not-required",
            Status::Verified => "verified",
            Status::Unsigned => "unsigned",
            Status::UntrustedKey => "untrusted-key",
            Status::Bad => "bad",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub status: Status,
    /// The strictest mode among the scopes not satisfied (none when every one is).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The fingerprints of the trusted keys whose signatures verified.
    pub keys: Vec<String>,
    /// The scopes not satisfied, and why, for people.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl Verdict {
    /// Whether the tier is served: not when a `require` scope is unsatisfied.
    pub fn served(&self) -> bool {
        self.mode != Some(Mode::Require)
    }
}

/// Judges `subject` by `policy` against its stored signatures.
pub fn judge(policy: &Policy, subject: Subject, signatures: &[Stored]) -> Verdict {
    let message = subject.message();
    // A stored text that no longer parses (edited in the database) counts as a bad signature
    // by no key: it satisfies nothing.
    let parsed: Vec<(&str, Signed)> = signatures
        .iter()
        .filter(|s| s.tier == subject.tier)
        .filter_map(|s| Some((s.signature.as_str(), Signed::parse(&s.signature).ok()?)))
        .collect();
    let mut verdict = Verdict {
        status: Status::NotRequired,
        mode: None,
        keys: Vec::new(),
        problems: Vec::new(),
    };
    let mut worst: Option<(Status, Mode)> = None;
    let mut any = false;
    for scope in policy.covering(subject.url, subject.tier) {
        any = true;
        let trusted: Vec<&(&str, Signed)> = parsed
            .iter()
            .filter(|(_, s)| scope.trusts(&s.key()))
            .collect();
        if let Some((_, s)) = trusted.iter().find(|(text, s)| verified(text, s, &message)) {
            let fp = s.fingerprint();
            if !verdict.keys.contains(&fp) {
                verdict.keys.push(fp);
            }
            continue;
        }
        let status = match (parsed.is_empty(), trusted.is_empty()) {
            (true, _) => Status::Unsigned,
            (false, true) => Status::UntrustedKey,
            (false, false) => Status::Bad,
        };
        verdict.problems.push(format!(
            "{} ({}): {}",
            scope.name,
            scope.mode.as_str(),
            match status {
                Status::Unsigned => "no signature".to_owned(),
                Status::UntrustedKey => format!(
                    "signed only by keys it does not trust ({})",
                    parsed.iter().map(|(_, s)| s.fingerprint()).collect::<Vec<_>>().join(", ")
                ),
                _ => "a signature by a trusted key does not sign these bytes in this tier".to_owned(),
            }
        ));
        // `require` outranks `warn`; among equals, the first problem found stands.
        let stricter = match worst {
            None => true,
            Some((_, m)) => m == Mode::Warn && scope.mode == Mode::Require,
        };
        if stricter {
            worst = Some((status, scope.mode));
        }
    }
    match worst {
        Some((status, mode)) => {
            verdict.status = status;
            verdict.mode = Some(mode);
        }
        None if any => verdict.status = Status::Verified,
        None => {}
    }
    verdict
}

/// Whether `signed` (stored as `text`) signs `message`, remembered by their digest.
fn verified(text: &str, signed: &Signed, message: &str) -> bool {
    static MEMORY: OnceLock<Mutex<HashMap<Digest, bool>>> = OnceLock::new();
    let mut h = Hasher::default();
    for part in [text, message] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let key = h.finish();
    let memory = MEMORY.get_or_init(Mutex::default);
    if let Some(&ok) = memory.lock().expect("verifications lock").get(&key) {
        return ok;
    }
    let ok = signed.verifies(message);
    let mut m = memory.lock().expect("verifications lock");
    if m.len() >= REMEMBERED {
        m.clear();
    }
    m.insert(key, ok);
    ok
}
