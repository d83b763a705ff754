//! The trust policy applied to an open's toolkits before any of their skills is served: each
//! toolkit's bundle judged in the tier it is for, against the signatures the state database
//! keeps (and, when those do not verify it, the ones beside it in the store of record). A
//! toolkit refused under `require` is left out of the stack — neither mounted nor written
//! into the working tree, so the mount and the MCP tools alike never serve it — and the open
//! says why; its refusal is audited (`signature.refused`, throttled like every refusal). A
//! workspace's owner tier is judged again each time it is made live (restored after a
//! restart, resumed from a pause), so a signature withdrawn, or a policy tightened, reaches
//! the workspaces already open.

use super::Workspaces;
use crate::stack::OwnerBundle;
use cloud_harness_control::audit;
use cloud_harness_control::signatures::policy::Policy;
use cloud_harness_control::signatures::stored;
use cloud_harness_control::signatures::verdict::{judge, Status, Verdict};
use cloud_harness_control::signatures::{canonical, Subject};
use cloud_harness_control::state::Db;
use cloud_harness_control::toolkit::Toolkit;
use cloud_harness_error::Result;
use cloud_harness_provision::Acquired;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

impl Workspaces {
    /// The verdict on each of `acquired`, in order (none when no scope of the policy covers
    /// it), for the open (or preview) `subject` by `actor`; a warning for each toolkit not
    /// verified.
    pub(super) fn judge_signatures(
        &self,
        acquired: &[(Toolkit, Acquired)],
        actor: &str,
        subject: &str,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<Option<Verdict>>> {
        if self.trust.is_empty() {
            return Ok(acquired.iter().map(|_| None).collect());
        }
        let mut verdicts = Vec::with_capacity(acquired.len());
        for (t, a) in acquired {
            let bundle = a.record.bundle.to_string();
            let on = Subject {
                url: &a.record.key.url,
                commit: &a.record.key.commit,
                bundle: &bundle,
                tier: t.scope.as_str(),
            };
            if self.trust.covering(on.url, on.tier).next().is_none() {
                verdicts.push(None);
                continue;
            }
            let mut verdict = judge(&self.trust, on, &stored::of_subject(&self.db, on)?);
            // Not verified by what the database has: the store of record may hold a signature
            // this runner has not taken yet (made on another runner with a database of its
            // own). Asked at most every 10 s for the same subject.
            if verdict.status != Status::Verified && self.import_signatures(on) {
                verdict = judge(&self.trust, on, &stored::of_subject(&self.db, on)?);
            }
            let url = canonical(on.url);
            if !verdict.problems.is_empty() {
                let served = verdict.served();
                warnings.push(format!(
                    "toolkit {} ({} at {}) {} in the {} tier: {}",
                    t.instance_id,
                    url,
                    on.commit,
                    if served {
                        "is served unverified"
                    } else {
                        "is not served"
                    },
                    on.tier,
                    verdict.problems.join("; ")
                ));
                if !served {
                    self.audit_refusal(actor, subject, on, &verdict);
                }
            }
            verdicts.push(Some(verdict));
        }
        Ok(verdicts)
    }

    /// Takes the signatures of `on` the store of record holds that verify and that the policy
    /// trusts; whether any was taken. A bucket that cannot be read leaves the database as it
    /// was (the verdict then rests on what it has).
    fn import_signatures(&self, on: Subject) -> bool {
        let Some(remote) = self.provisioner.remote() else {
            return false;
        };
        if !may_ask(&on.message()) {
            return false;
        }
        let found = match remote.signatures(on) {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(bundle = on.bundle, error = %e, "cannot read the store of record's signatures");
                return false;
            }
        };
        let trusted = |key: &cloud_harness_control::signatures::PublicKey| {
            self.trust.covering(on.url, on.tier).any(|s| s.trusts(key))
        };
        let mut taken = false;
        for text in found {
            match stored::import(&self.db, on, &text, trusted) {
                Ok(kept) => taken |= kept,
                Err(e) => {
                    tracing::warn!(bundle = on.bundle, tier = on.tier, error = %e, "a signature in the store of record is not one: passed over")
                }
            }
        }
        taken
    }

    fn audit_refusal(&self, actor: &str, subject: &str, on: Subject, verdict: &Verdict) {
        let what = format!("toolkit:{}", canonical(on.url));
        let Some(repeated) = audit::admit_refusal(actor, "signature.refused", &what) else {
            return;
        };
        let details = json!({
            "via": subject, "tier": on.tier, "commit": on.commit, "bundle": on.bundle,
            "status": verdict.status, "problems": verdict.problems, "repeated": repeated,
        });
        if let Err(e) = audit::event(&self.db, actor, "signature.refused", &what, &details) {
            tracing::error!(error = %e, "cannot record a signature's refusal in the audit log");
        }
    }
}

/// The owner bundles of a workspace being made live that `policy` lets it serve; a warning
/// for each it no longer does (the workspace serves the rest).
pub(super) fn served_owner_bundles(
    db: &Db,
    policy: &Policy,
    bundles: &[OwnerBundle],
    warnings: &mut Vec<String>,
) -> Result<Vec<OwnerBundle>> {
    if policy.is_empty() {
        return Ok(bundles.to_vec());
    }
    let mut served = Vec::with_capacity(bundles.len());
    for b in bundles {
        let bundle = b.bundle.to_string();
        let on = Subject {
            url: &b.url,
            commit: &b.commit,
            bundle: &bundle,
            tier: "owner",
        };
        if policy.covering(on.url, on.tier).next().is_none() {
            served.push(b.clone());
            continue;
        }
        let verdict = judge(policy, on, &stored::of_subject(db, on)?);
        if verdict.served() {
            served.push(b.clone());
        } else {
            warnings.push(format!(
                "toolkit {} ({} at {}) is no longer served in the owner tier: {}",
                b.instance_id,
                canonical(on.url),
                on.commit,
                verdict.problems.join("; ")
            ));
        }
    }
    Ok(served)
}

/// Whether the store of record may be asked for the signatures of `subject` now: not when it
/// was asked in the last 10 s (an unsigned toolkit opened in a loop asks that often, no more).
fn may_ask(subject: &str) -> bool {
    const EVERY: Duration = Duration::from_secs(10);
    const REMEMBERED: usize = 4096;
    static ASKED: OnceLock<Mutex<HashMap<String, Instant>>> = OnceLock::new();
    let mut asked = ASKED
        .get_or_init(Mutex::default)
        .lock()
        .expect("asked lock");
    let now = Instant::now();
    if asked
        .get(subject)
        .is_some_and(|at| now.duration_since(*at) < EVERY)
    {
        return false;
    }
    if asked.len() >= REMEMBERED {
        asked.retain(|_, at| now.duration_since(*at) < EVERY);
        if asked.len() >= REMEMBERED {
            return false;
        }
    }
    asked.insert(subject.to_owned(), now);
    true
}
