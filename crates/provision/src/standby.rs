//! Helpers on standby: fresh helper containers made and started before a fetch needs them,
//! each waiting for its one job on standard input, so that a fetch no longer waits for a
//! container to be created and started (most of a helper fetch's own cost). A helper on
//! standby has run nothing but the wait: it is made exactly as one made for the fetch (the
//! same image, hardening, network and work folder), serves one fetch and is removed like any
//! other. Only long-lived processes keep helpers on standby (`serve`, with
//! `CLOUD_HARNESS_STANDBY_HELPERS`); a CLI makes its helper when it fetches.
//!
//! Helpers on standby are this process's (the owner label of `warm`): removed with the warm
//! network they sit on, and by the next process if this one dies.

use crate::containers::{hardened, start, PROXY_PORT};
use crate::engine::{block_on, connect, docker_error};
use crate::ownership;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptions, InspectContainerOptions};
use bollard::Docker;
use cloud_harness_error::Result;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// What a helper is made with, besides what every helper shares: a helper on standby serves
/// a fetch of the same shape only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub image: String,
    /// The warm internal network, and the proxy's address on it.
    pub network: String,
    pub proxy_ip: String,
    /// The size of its work folder (a tmpfs), from the byte ceiling.
    pub work_kb: u64,
}

/// Makes a helper container named `name` and starts it; it then waits for its job on
/// standard input. `env` adds to its environment (tests take the proxy away with it). It is
/// labelled as this process's, so one that a killed process leaves is removed by the next.
pub(crate) async fn make(docker: &Docker, name: &str, shape: &Shape, env: &[String]) -> Result<()> {
    // The internal network alone, no DNS of its own: the proxy's name is in its hosts file.
    let mut host = hardened(&shape.network, 512 << 20);
    host.extra_hosts = Some(vec![format!("provisioning-proxy:{}", shape.proxy_ip)]);
    host.dns = Some(vec!["127.0.0.1".into()]);
    host.tmpfs = Some(HashMap::from([(
        "/work".to_owned(),
        format!("rw,size={}k,mode=1777", shape.work_kb),
    )]));
    let mut environment = vec![
        format!("HTTPS_PROXY=http://provisioning-proxy:{PROXY_PORT}"),
        "HOME=/work".into(),
    ];
    environment.extend(env.iter().cloned());
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.to_owned()),
                ..Default::default()
            }),
            ContainerCreateBody {
                image: Some(shape.image.clone()),
                cmd: Some(vec!["/cloud-harness".into(), "fetch-pack".into()]),
                env: Some(environment),
                user: Some("65534:65534".into()),
                working_dir: Some("/work".into()),
                labels: Some(ownership::labels(true)),
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                open_stdin: Some(true),
                // The job's writer closing its end closes the helper's standard input.
                stdin_once: Some(true),
                host_config: Some(host),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| docker_error("creating the helper container", e))?;
    start(docker, name, "starting the helper").await
}

/// A new helper's name.
pub(crate) fn name() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("cloud-harness-fetch-{}", &id[..12])
}

/// The helpers on standby of one process.
#[derive(Default)]
pub(crate) struct Standby {
    /// How many to keep ready of each shape asked for (0: none).
    target: AtomicUsize,
    state: Mutex<State>,
    /// Signalled when a helper being made is done (see [`Standby::drain`]).
    made: Condvar,
}

#[derive(Default)]
struct State {
    ready: Vec<(String, Shape)>,
    /// Helpers being made now, by shape.
    making: Vec<Shape>,
    /// Fetches under way, and the helpers serving them: a process letting its network go
    /// removes these too (a server stopped mid-fetch leaves no helper behind).
    fetches: usize,
    busy: Vec<String>,
    /// No more helpers: the process is letting its warm network go.
    closed: bool,
}

impl Standby {
    pub(crate) fn ready(&self) -> usize {
        self.state.lock().expect("standby lock").ready.len()
    }

    pub(crate) fn set_target(&self, target: usize) {
        self.target.store(target, Ordering::Relaxed);
    }

    /// A helper on standby for `shape` that is still running, taken for one fetch. Helpers
    /// that stopped (an engine restart) are removed on the way.
    pub(crate) async fn take(&self, docker: &Docker, shape: &Shape) -> Option<String> {
        loop {
            let name = {
                let mut state = self.state.lock().expect("standby lock");
                let at = state.ready.iter().position(|(_, s)| s == shape)?;
                state.ready.swap_remove(at).0
            };
            let running = docker
                .inspect_container(&name, None::<InspectContainerOptions>)
                .await
                .ok()
                .and_then(|c| c.state.and_then(|s| s.running))
                .unwrap_or(false);
            if running {
                return Some(name);
            }
            tracing::warn!(helper = %name, "a helper on standby stopped; removing it");
            crate::engine::remove_container(docker, &name).await;
        }
    }

    /// A fetch in a helper begins.
    pub(crate) fn begin(&self) {
        self.state.lock().expect("standby lock").fetches += 1;
    }

    /// The helper `name` serves a fetch from now on.
    pub(crate) fn serving(&self, name: &str) {
        let mut state = self.state.lock().expect("standby lock");
        state.busy.push(name.to_owned());
    }

    /// A fetch ended (its helper, if it had one, removed); once none is under way, the standby
    /// is filled again with helpers of `shape`. Not sooner: making containers takes the CPU
    /// the fetches of the same open still need (measured: a two-toolkit open took 545 ms
    /// refilling after each fetch, 455-504 ms refilling after the last).
    pub(crate) fn end(self: &Arc<Self>, helper: Option<&str>, shape: Option<&Shape>) {
        let idle = {
            let mut state = self.state.lock().expect("standby lock");
            state.busy.retain(|b| Some(b.as_str()) != helper);
            state.fetches = state.fetches.saturating_sub(1);
            state.fetches == 0
        };
        if let (true, Some(shape)) = (idle, shape) {
            self.refill(shape);
        }
    }

    /// Makes helpers of `shape` in the background until `target` of them are ready or being
    /// made. Each is made on a thread of its own: a fetch never waits for one.
    pub(crate) fn refill(self: &Arc<Self>, shape: &Shape) {
        let wanted = {
            let mut state = self.state.lock().expect("standby lock");
            if state.closed {
                return;
            }
            let have = state.ready.iter().filter(|(_, s)| s == shape).count()
                + state.making.iter().filter(|s| *s == shape).count();
            let wanted = self.target.load(Ordering::Relaxed).saturating_sub(have);
            state
                .making
                .extend(std::iter::repeat_n(shape.clone(), wanted));
            wanted
        };
        for _ in 0..wanted {
            let (standby, shape) = (self.clone(), shape.clone());
            std::thread::spawn(move || standby.make_one(shape));
        }
    }

    fn make_one(&self, shape: Shape) {
        let name = name();
        let made = {
            let (name, shape) = (name.clone(), shape.clone());
            block_on(async move {
                let docker = connect().await?;
                let made = make(&docker, &name, &shape, &[]).await;
                if made.is_err() {
                    crate::engine::remove_container(&docker, &name).await;
                }
                made
            })
        };
        let mut state = self.state.lock().expect("standby lock");
        match made {
            Ok(()) if !state.closed => state.ready.push((name, shape.clone())),
            // Removed before it counts as made: `drain` waits for it, and the network after.
            Ok(()) => remove_now(vec![name]),
            Err(e) => tracing::warn!(error = %e, "cannot put a helper on standby"),
        }
        if let Some(at) = state.making.iter().position(|s| *s == shape) {
            state.making.swap_remove(at);
        }
        drop(state);
        self.made.notify_all();
    }

    /// The helpers on standby on `network`, taken out to be removed with it.
    pub(crate) fn on_network(&self, network: &str) -> Vec<String> {
        let mut state = self.state.lock().expect("standby lock");
        let (gone, kept) = std::mem::take(&mut state.ready)
            .into_iter()
            .partition(|(_, s)| s.network == network);
        state.ready = kept;
        gone.into_iter().map(|(name, _)| name).collect()
    }

    /// Takes every helper out, those on standby (once those being made are done) and those
    /// serving a fetch, and makes no more: what is returned is all there is to remove before
    /// the warm network goes.
    pub(crate) fn drain(&self) -> Vec<String> {
        let mut state = self.state.lock().expect("standby lock");
        state.closed = true;
        while !state.making.is_empty() {
            state = self.made.wait(state).expect("standby lock");
        }
        let mut all: Vec<String> = std::mem::take(&mut state.ready)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        all.append(&mut state.busy);
        all
    }
}

/// Removes helpers now, from any thread.
pub(crate) fn remove_now(names: Vec<String>) {
    if names.is_empty() {
        return;
    }
    let removed = block_on(async move {
        let docker = connect().await?;
        for name in &names {
            crate::engine::remove_container(&docker, name).await;
        }
        Ok(())
    });
    if let Err(e) = removed {
        tracing::warn!(error = %e, "cannot remove helpers on standby");
    }
}
