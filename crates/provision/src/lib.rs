//! Provisioning: acquiring toolkits into the store. A toolkit already in the bundle index with
//! all its objects present is a warm start (no DNS lookup, no connection); otherwise its
//! commit is fetched (in-process, through the egress settings), staged under containment
//! checks, normalized into a bundle and recorded.
//!
//! It is the only crate that fetches (git, object storage) and the one that parses fetched
//! bytes before they are in the store. It knows nothing of workspaces, executors, MCP or HTTP.

mod acquire;
pub mod acquisitions;
pub mod cache;
pub mod containers;
pub mod egress;
pub mod engine;
pub mod fetch;

pub mod index;
pub mod inventory;
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
use cloud_harness_control::toolkit::Revision;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::Store;
use index::{BundleIndex, BundleRecord};
use serde::Serialize;
use std::sync::OnceLock;
use std::time::Instant;

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
}
