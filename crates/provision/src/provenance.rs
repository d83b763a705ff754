//! What the provisioner does with a commit's reachability (`reach`): checks it once a commit
//! is fetched, before anything is staged, and admits a recorded bundle by its record alone (a
//! warm start asks nothing). A commit no branch or tag reaches is served only where the
//! toolkit names the registry entry that allows it; otherwise it is COMMIT_NOT_IN_REPOSITORY
//! and nothing is published.

use super::index::{BundleIndex, BundleRecord};
use super::reach::{self, Reach};
use super::{fetch, observe::Observer, Provisioner};
use cloud_harness_control::toolkit::{Revision, Toolkit};
use cloud_harness_error::{Code, Error, Result};
use std::time::{Duration, Instant};

impl Provisioner {
    /// The reachability of the commit just fetched for `toolkit` as `revision` from
    /// `fetched_url`: a tag or the default branch named it (nothing to ask); an exact commit
    /// is looked for among the repository's branches and tags. Refused when none reaches it
    /// and the toolkit is not allowed it.
    pub(super) fn reach_of_fetched(
        &self,
        toolkit: &Toolkit,
        revision: &Revision,
        fetched: &mut fetch::Fetched,
        fetched_url: &str,
        observer: &Observer,
        started: Instant,
    ) -> Result<Reach> {
        let committed_at = fetched
            .repo
            .find_commit(fetched.commit)
            .ok()
            .and_then(|c| c.time().ok())
            .map_or(0, |t| t.seconds);
        let reach = match (&toolkit.revision, revision) {
            (Revision::Tag(t), _) => Reach::requested(&format!("refs/tags/{t}"), committed_at),
            (Revision::DefaultHead, Revision::DefaultHead) => {
                Reach::requested("HEAD", committed_at)
            }
            _ => match self.check_reach(
                fetched_url,
                (fetched.commit, fetched.repo.object_hash()),
                committed_at,
                fetched.advertised.take(),
                observer,
                started,
            ) {
                Ok(reach) => reach,
                // An entry that allows the commit is served whatever the check could not
                // find out (a history past the ceiling, say); it is recorded as unknown.
                Err(e) if toolkit.allow_unreachable.is_some() && e.code != Code::Cancelled => {
                    tracing::warn!(url = %fetched_url, error = %e.message, "the provenance check did not finish; the registry entry allows the commit");
                    Reach::unknown(committed_at)
                }
                Err(e) => return Err(e),
            },
        };
        allowed(toolkit, &fetched.commit.to_string(), &reach)?;
        Ok(reach)
    }

    /// `record` when its toolkit may be served from it: a commit recorded as unreachable is
    /// asked about again (a branch may have come to reach it since, or it was allowed for
    /// another entry) unless the toolkit is allowed it; the record is updated when it now is.
    pub(super) fn admit(
        &self,
        index: &BundleIndex,
        mut record: BundleRecord,
        toolkit: &Toolkit,
        observer: &Observer,
    ) -> Result<BundleRecord> {
        let Some(recorded) = record.reach.as_ref().filter(|r| !r.reachable) else {
            return Ok(record);
        };
        if toolkit.allow_unreachable.is_some() {
            return Ok(record);
        }
        let url = self.hosts().check(&record.key.url, "url")?;
        let commit = gix::ObjectId::from_hex(record.key.commit.as_bytes())
            .map_err(|e| Error::internal(format!("recorded commit: {e}")))?;
        let hash = match record.object_format.as_str() {
            "sha256" => gix::hash::Kind::Sha256,
            _ => gix::hash::Kind::Sha1,
        };
        observer.admit_fetch()?;
        let started = Instant::now();
        let reach = self.check_reach(
            &url,
            (commit, hash),
            recorded.committed_at,
            None,
            observer,
            started,
        )?;
        allowed(toolkit, &record.key.commit, &reach)?;
        record.reach = Some(reach);
        index.put(&record)?;
        Ok(record)
    }

    /// Whether a branch or tag of `url` reaches `commit`, asked from this host through the
    /// egress proxy (refs, then history under the fetch's ceiling and deadline).
    fn check_reach(
        &self,
        url: &str,
        (commit, hash): (gix::ObjectId, gix::hash::Kind),
        committed_at: i64,
        advertised: Option<fetch::Advertised>,
        observer: &Observer,
        started: Instant,
    ) -> Result<Reach> {
        observer.set_phase("checking");
        let deadline = started + Duration::from_secs(self.limits.max_seconds);
        reach::check(
            url,
            commit,
            hash,
            committed_at,
            advertised,
            &self.transport()?,
            &self.store.tmp_dir(),
            deadline,
            &fetch::Ceiling {
                max_bytes: self.limits.max_bytes.saturating_mul(2),
                setting: "twice CLOUD_HARNESS_MAX_BYTES, for the history looked at",
                max_object: self.limits.max_file_bytes.saturating_mul(2),
                object_setting: "per file (twice CLOUD_HARNESS_MAX_FILE_BYTES)",
            },
            observer,
        )
        .map_err(|e| self.explain(url, e, started))
    }
}

/// Refuses `commit`, which `reach` found unreachable, unless `toolkit` is allowed it.
fn allowed(toolkit: &Toolkit, commit: &str, reach: &Reach) -> Result<()> {
    match reach.reachable || toolkit.allow_unreachable.is_some() {
        true => Ok(()),
        false => Err(reach::not_in_repository(&toolkit.url, commit, reach)),
    }
}
