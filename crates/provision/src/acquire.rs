//! An acquisition: a warm start from the bundle index, a start from the fleet's store of
//! record, or a fetch from git (checked, staged, normalized, recorded and published), one per
//! repository and revision at a time.

use super::index::{self, BundleKey, BundleRecord};
use super::{fetch, normalize, observe, staging, verify_fetched, Acquired, Provisioner};
use cloud_harness_control::toolkit::{Revision, Toolkit};
use cloud_harness_error::{Code, Error, Result};
use std::time::{Duration, Instant, SystemTime};

impl Provisioner {
    /// Acquires `toolkit` into the store. Concurrent acquisitions of one repository revision
    /// (several workspaces opening with the same toolkit) fetch once: the others wait, then
    /// find its bundle in the index.
    pub fn acquire(&self, toolkit: &Toolkit) -> Result<Acquired> {
        self.acquire_observed(toolkit, &observe::Observer::default())
    }

    /// [`Provisioner::acquire`], showing its phase and bytes to `observer` and stopping when
    /// it is cancelled.
    pub fn acquire_observed(
        &self,
        toolkit: &Toolkit,
        observer: &observe::Observer,
    ) -> Result<Acquired> {
        let key = format!("{}\n{}", toolkit.url, toolkit.revision.to_arg());
        observer.set_phase("queued");
        self.acquiring
            .with(&key, || self.acquire_now(toolkit, observer))
    }

    fn acquire_now(&self, toolkit: &Toolkit, observer: &observe::Observer) -> Result<Acquired> {
        let started = Instant::now();
        let index = self.index();
        let bytes = std::cell::Cell::new(0u64);
        let done = |mut record: BundleRecord, warm: bool, mode: &'static str| {
            // The same bundle may have been acquired under another name before.
            record.instance_id = toolkit.instance_id.clone();
            record.preset = toolkit.preset.clone();
            let unreachable = record.reach.as_ref().is_some_and(|r| !r.reachable);
            Acquired {
                allowed_unreachable: toolkit.allow_unreachable.clone().filter(|_| unreachable),
                record,
                warm,
                mode,
                millis: started.elapsed().as_millis() as u64,
                bytes: bytes.get(),
            }
        };
        let cancelled = || {
            Error::new(
                Code::Cancelled,
                format!("acquiring {} was cancelled", toolkit.url),
            )
        };
        let known = match &toolkit.revision {
            Revision::Commit(c) => Some(c.clone()),
            Revision::Tag(t) => index
                .tag(&toolkit.url, t)
                .or_else(|| self.remote_tag(toolkit, t)),
            Revision::DefaultHead => None,
        };
        // Set when the store of record had this bundle but it could not be used: reported if
        // git cannot stand in for it.
        let mut remote_failure = None;
        if let Some(commit) = &known {
            let key = BundleKey::new(toolkit, commit);
            if let Some(record) = index.get(&key) {
                if index.complete(&record) {
                    let record = self.admit(&index, record, toolkit, observer)?;
                    index.touch(&key);
                    self.complete_publication(&record);
                    return Ok(done(record, true, "warm"));
                }
            }
            match self.start_from_remote(&index, &key) {
                Ok(Some((record, moved))) => {
                    bytes.set(moved.bytes);
                    let record = self.admit(&index, record, toolkit, observer)?;
                    return Ok(done(record, true, "remote"));
                }
                Ok(None) => {}
                Err(e) => remote_failure = Some(e),
            }
        }

        let fetched_url = self.hosts().check(&toolkit.url, "url")?;
        if observer.is_cancelled() {
            return Err(cancelled());
        }
        observer.admit_fetch()?;
        observer.set_phase("fetching");
        let fetched =
            self.fetch_and_record(toolkit, &known, &fetched_url, observer, started, &bytes);
        match (fetched, remote_failure) {
            (Ok((record, warm_after_fetch)), _) => Ok(done(
                record,
                false,
                if warm_after_fetch {
                    "warm"
                } else {
                    self.mode()
                },
            )),
            (Err(e), Some(mut remote)) => {
                remote.details["git"] = e.message.into();
                Err(remote)
            }
            (Err(e), None) => Err(e),
        }
    }

    /// Fetches the toolkit from git, stages and normalizes it, records it and publishes it.
    /// True when another acquisition recorded the same bundle meanwhile.
    fn fetch_and_record(
        &self,
        toolkit: &Toolkit,
        known: &Option<String>,
        fetched_url: &str,
        observer: &observe::Observer,
        started: Instant,
        bytes: &std::cell::Cell<u64>,
    ) -> Result<(BundleRecord, bool)> {
        let index = self.index();
        let cancelled = || {
            Error::new(
                Code::Cancelled,
                format!("acquiring {} was cancelled", toolkit.url),
            )
        };
        let fetched_url = fetched_url.to_owned();
        let deadline = started + Duration::from_secs(self.limits.max_seconds);
        let scratch = tempfile::Builder::new()
            .prefix("fetch-")
            .tempdir_in(self.store.tmp_dir())
            .map_err(|e| Error::io(&self.store.tmp_dir(), e))?;
        let revision = match known {
            Some(c) => Revision::Commit(c.clone()),
            None => toolkit.revision.clone(),
        };
        let mut fetched = match self.sandbox() {
            Some(sandbox) => sandbox.fetch(
                &fetched_url,
                &revision,
                &self.transport,
                &self.egress,
                self.limits,
                deadline,
                &scratch.path().join("repo"),
            ),
            None => fetch::fetch(
                &fetched_url,
                &revision,
                &self.transport()?,
                &scratch.path().join("repo"),
                deadline,
                &fetch::Ceiling {
                    max_bytes: self.limits.max_bytes.saturating_mul(2),
                    setting: "twice CLOUD_HARNESS_MAX_BYTES",
                    // As the host indexes a helper's pack (`pack::index_pack_from`).
                    max_object: self.limits.max_file_bytes.saturating_mul(2),
                    object_setting: "per file (twice CLOUD_HARNESS_MAX_FILE_BYTES)",
                },
                observer,
            )
            .map_err(|e| self.explain(&fetched_url, e, started)),
        }?;
        if observer.is_cancelled() {
            return Err(cancelled());
        }
        verify_fetched(&revision, &fetched, &fetched_url)?;
        bytes.set(fetch::pack_bytes(&scratch.path().join("repo")));
        observer.set_bytes(bytes.get());
        let reach = self.reach_of_fetched(
            toolkit,
            &revision,
            &mut fetched,
            &fetched_url,
            observer,
            started,
        )?;
        let commit = fetched.commit.to_string();
        if let Revision::Tag(t) = &toolkit.revision {
            index.set_tag(&toolkit.url, t, &commit)?;
            if let Some(remote) = &self.remote {
                if let Err(e) = remote.put_tag(&toolkit.url, t, &commit) {
                    tracing::warn!(url = %toolkit.url, tag = %t, error = %e.message, "the tag was not recorded in the store of record");
                }
            }
        }
        let key = BundleKey::new(toolkit, &commit);
        if let Some(record) = index.get(&key).filter(|r| index.complete(r)) {
            return Ok((self.admit(&index, record, toolkit, observer)?, true));
        }

        cloud_harness_error::failpoint::point("acquire.fetched");
        observer.set_phase("staging");
        let mut writer = self.store.writer()?;
        let staged = staging::stage(
            &fetched.repo,
            fetched.commit,
            &toolkit.subdirectory,
            &mut writer,
            self.limits,
            deadline,
        )?;
        writer.commit()?;
        let object_format = fetched.repo.object_hash().to_string();
        drop(fetched);
        let source = normalize::SourceInfo {
            url: toolkit.url.clone(),
            fetched_url: fetched_url.clone(),
            commit: commit.clone(),
            object_format: object_format.clone(),
            subdirectory: toolkit.subdirectory.clone(),
        };
        let bundle =
            normalize::normalize(&self.store, staged.tree, toolkit, source, staged.warnings)?;
        let record = BundleRecord {
            key,
            bundle: bundle.tree,
            manifest: bundle.manifest,
            skills: bundle.skills,
            instance_id: toolkit.instance_id.clone(),
            preset: toolkit.preset.clone(),
            fetched_url,
            object_format,
            requested: index::describe(&toolkit.revision),
            warnings: bundle.warnings,
            skipped: bundle.skipped,
            acquired_at: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            pack: None,
            reach: Some(reach),
        };
        cloud_harness_error::failpoint::point("acquire.normalized");
        self.record_and_publish(&index, &record)?;
        cloud_harness_error::failpoint::point("acquire.recorded");
        Ok((record, false))
    }
}
