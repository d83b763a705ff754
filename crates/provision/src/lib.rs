//! Provisioning: acquiring toolkits into the store. A toolkit already in the bundle index with
//! all its objects present is a warm start (no DNS lookup, no connection); otherwise its
//! commit is fetched (in-process, through the egress settings), staged under containment
//! checks, normalized into a bundle and recorded.
//!
//! It is the only crate that fetches (git, object storage) and the one that parses fetched
//! bytes before they are in the store. It knows nothing of workspaces, executors, MCP or HTTP.

pub mod acquisitions;
pub mod cache;
pub mod containers;
pub mod egress;
pub mod engine;
pub mod fetch;

pub mod index;
pub mod normalize;
pub mod observe;
mod ownership;
pub(crate) mod pack;
mod provenance;
pub mod proxy;
pub mod publication;
pub mod reach;
pub mod remote;
pub mod sandbox;
pub mod staging;
mod standby;
mod warm;

use cloud_harness_control::hosts;
use cloud_harness_control::toolkit::{Revision, Toolkit};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::Store;
use index::{BundleIndex, BundleKey, BundleRecord};
use serde::Serialize;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

/// An acquired toolkit's bundle as a source of `tier`, named `<tier>:<instanceId>`, its
/// skills that break the Agent Skills specification served or not by `validation`.
#[allow(clippy::too_many_arguments)]
pub fn bundle_source(
    store: &Store,
    cache: &cloud_harness_skills::discovery::SkillCache,
    tier: cloud_harness_skills::resolver::Tier,
    instance_id: &str,
    url: &str,
    commit: &str,
    bundle: cloud_harness_store::cas::Digest,
    validation: cloud_harness_skills::spec::Validation,
) -> Result<cloud_harness_skills::resolver::Source> {
    use cloud_harness_skills::resolver::Provenance;
    cloud_harness_skills::stack::tree_source(
        store,
        cache,
        format!("{tier}:{instance_id}"),
        tier,
        Provenance {
            toolkit: Some(instance_id.to_owned()),
            url: Some(url.to_owned()),
            commit: Some(commit.to_owned()),
            path: None,
        },
        bundle,
        &cloud_harness_skills::discovery::Layout {
            validation,
            ..cloud_harness_skills::discovery::Layout::folder()
        },
    )
}

/// A fetch (in a helper container above all, whose word is not trusted) must hand back the
/// commit that was asked for: an exact commit id is compared, never taken on faith. (A tag or
/// the default head is whatever the server says it is; the commit found is recorded.)
pub fn verify_fetched(revision: &Revision, fetched: &fetch::Fetched, url: &str) -> Result<()> {
    if let Revision::Commit(wanted) = revision {
        let got = fetched.commit.to_string();
        if !got.eq_ignore_ascii_case(wanted) {
            return Err(Error::new(
                Code::Upstream,
                format!(
                    "fetching {url} asked for commit {wanted} and got {got}; nothing was published"
                ),
            )
            .with_details(serde_json::json!({ "url": url, "wanted": wanted, "got": got })));
        }
        fetched.repo.find_commit(fetched.commit).map_err(|_| {
            Error::new(
                Code::Upstream,
                format!("the fetch of {url} lacks commit {wanted}"),
            )
        })?;
    }
    Ok(())
}

/// The result of one acquisition.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Acquired {
    #[serde(flatten)]
    pub record: BundleRecord,
    /// True when nothing was fetched: the bundle was in the index, complete.
    pub warm: bool,
    /// Where the fetch ran.
    pub mode: &'static str,
    pub millis: u64,
    /// What was fetched (the pack's bytes); 0 for a warm start.
    pub bytes: u64,
    /// The registry entry whose override served a commit no branch or tag reaches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_unreachable: Option<String>,
}

pub struct Provisioner {
    pub store: Store,
    pub transport: fetch::Transport,
    pub limits: staging::Limits,
    /// Ceilings of a project repository's clone.
    pub project_limits: fetch::CloneLimits,
    /// The egress rules, the host allowlist among them.
    pub egress: egress::EgressPolicy,
    /// Helper containers, when a Docker engine is there: given, or looked for on first need
    /// (a warm start never asks the engine).
    sandbox: OnceLock<Option<sandbox::Sandbox>>,
    /// The egress proxy in-process fetches go through, started on first use.
    embedded: std::sync::Mutex<Option<proxy::EmbeddedProxy>>,
    /// One acquisition per repository and revision at a time.
    acquiring: cloud_harness_control::keyed_lock::KeyedLock,
    /// The fleet's store of record, when `TOOLKIT_STORE_URL` names one.
    remote: Option<remote::RemoteStore>,
    /// Released (the server is stopping): nothing is kept warm any more.
    released: std::sync::atomic::AtomicBool,
}

impl Provisioner {
    /// Fetches run in-process unless [`Provisioner::with_sandbox`] says otherwise.
    pub fn new(
        store: Store,
        transport: fetch::Transport,
        limits: staging::Limits,
        egress: egress::EgressPolicy,
    ) -> Provisioner {
        Provisioner {
            store,
            transport,
            limits,
            project_limits: fetch::CloneLimits::default(),
            egress,
            sandbox: OnceLock::from(None),
            embedded: std::sync::Mutex::new(None),
            acquiring: Default::default(),
            remote: None,
            released: Default::default(),
        }
    }

    /// Bundles are looked for in, and published to, this store of record from now on.
    pub fn with_remote(mut self, remote: Option<remote::RemoteStore>) -> Provisioner {
        self.remote = remote;
        self
    }

    pub fn remote(&self) -> Option<&remote::RemoteStore> {
        self.remote.as_ref()
    }

    /// Fetches run in helper containers of this engine from now on.
    pub fn with_sandbox(mut self, sandbox: Option<sandbox::Sandbox>) -> Provisioner {
        self.sandbox = OnceLock::from(sandbox);
        self
    }

    /// The host allowlist (and URL rewrites) every fetched URL must pass.
    pub fn hosts(&self) -> &hosts::HostPolicy {
        &self.egress.hosts
    }

    /// Removes what fetches keep warm (the provisioning network and proxy, helpers on
    /// standby), if any was made, and keeps nothing warm from now on.
    pub fn release(&self) {
        self.released
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(Some(sandbox)) = self.sandbox.get() {
            sandbox.release();
        }
    }

    /// When fetches run in helper containers: keeps `helpers` fresh helpers on standby from
    /// now on, and makes them and the provisioning network and proxy now, in the background
    /// (a server at start-up; see `standby`). Asks for the engine, so call it off the async
    /// threads.
    pub fn keep_warm(&self, helpers: usize) {
        let released = || self.released.load(std::sync::atomic::Ordering::SeqCst);
        // Asked again once the engine answered: a release meanwhile found no sandbox to tell.
        if released() || helpers == 0 {
            return;
        }
        if let (Some(sandbox), false) = (self.sandbox(), released()) {
            sandbox.keep_warm(helpers, &self.egress, self.limits);
        }
    }

    /// The helper-container engine, if there is one.
    pub fn sandbox(&self) -> Option<&sandbox::Sandbox> {
        self.sandbox
            .get_or_init(|| {
                std::env::current_exe()
                    .ok()
                    .and_then(sandbox::Sandbox::detect)
            })
            .as_ref()
    }

    /// Settings from the environment: `ALLOWED_GIT_HOSTS`, `CLOUD_HARNESS_URL_REWRITE`,
    /// `CLOUD_HARNESS_EXTRA_CA`, `HTTPS_PROXY`, `CLOUD_HARNESS_ALLOW_CIDRS`,
    /// `CLOUD_HARNESS_RESOLVE`, the `CLOUD_HARNESS_MAX_*` ceilings and the
    /// `CLOUD_HARNESS_PROJECT_MAX_*` ones.
    /// The Docker engine is looked for on first need.
    pub fn from_env(store: Store) -> Result<Provisioner> {
        let mut provisioner = Provisioner::new(
            store,
            fetch::Transport::from_env()?,
            staging::Limits::from_env()?,
            egress::EgressPolicy::from_env(hosts::HostPolicy::from_env()?)?,
        );
        provisioner.sandbox = OnceLock::new();
        provisioner.project_limits = fetch::CloneLimits::from_env()?;
        provisioner.remote = remote::RemoteStore::from_env()?;
        Ok(provisioner)
    }

    /// Where fetches run, for reports: the mode, the engine and its warnings.
    pub fn provisioning(&self) -> serde_json::Value {
        match self.sandbox() {
            Some(s) => {
                serde_json::json!({ "mode": self.mode(), "engine": s.engine_version, "warnings": s.warnings })
            }
            None => serde_json::json!({ "mode": self.mode(), "warnings": [] }),
        }
    }

    /// Where fetches run: `container` (a helper per fetch) or `in-process`.
    pub fn mode(&self) -> &'static str {
        if self.sandbox().is_some() {
            "container"
        } else {
            "in-process"
        }
    }

    /// A fetch error of a fetch that began at `since`, explained by the egress proxy when it
    /// turned the host away meanwhile: a refusal by policy is FORBIDDEN, an outage on the way
    /// (no address, a failed or timed-out dial) UPSTREAM or TIMEOUT, marked retryable.
    pub fn explain(&self, url: &str, error: Error, since: Instant) -> Error {
        let host = url::Url::parse(url)
            .ok()
            .and_then(|u| u.host_str().and_then(hosts::normalize_host));
        let refusal = host.and_then(|h| {
            let embedded = self.embedded.lock().expect("proxy lock");
            embedded.as_ref().and_then(|p| p.refusal(&h))
        });
        let Some(r) = refusal.filter(|r| r.at >= since) else {
            return error;
        };
        let (code, what) = match r.status {
            504 => (Code::Timeout, "the egress proxy timed out reaching"),
            502 => (Code::Upstream, "the egress proxy could not reach"),
            _ => (Code::Forbidden, "the egress proxy refused"),
        };
        Error::new(code, format!("{what} {}", r.reason)).with_details(serde_json::json!({
            "url": url,
            "egress": r.reason,
            "retryable": r.is_outage(),
        }))
    }

    /// How fetches reach git hosts: through the egress proxy (on loopback, started on first
    /// use), unless `HTTPS_PROXY` names another one (say a `cloud-harness proxy` elsewhere).
    pub fn transport(&self) -> Result<fetch::Transport> {
        if self.transport.proxy.is_some() {
            return Ok(self.transport.clone());
        }
        let mut embedded = self.embedded.lock().expect("proxy lock");
        if embedded.is_none() {
            *embedded = Some(proxy::EmbeddedProxy::start(self.egress.clone())?);
        }
        Ok(fetch::Transport {
            proxy: embedded.as_ref().map(|p| p.url()),
            ..self.transport.clone()
        })
    }

    pub fn index(&self) -> BundleIndex {
        BundleIndex::open(&self.store)
    }

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
