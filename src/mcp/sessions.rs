//! Sessions of the 2025-11-25 protocol over HTTP, bounded: each `initialize` keeps a session
//! (tens of KB) until it is closed or idle, so a client looping on `initialize` would grow the
//! server without end. Sessions are capped in all and per client address; one more is answered
//! 503 (the server is full) or 429 (this client has its share), with `Retry-After`, and idle
//! sessions close after a minute instead of the SDK's five.

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_sessions: usize,
    pub max_per_client: usize,
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sessions: 1000,
            max_per_client: 100,
            idle: Duration::from_secs(60),
        }
    }
}

impl Limits {
    /// The defaults, with `CLOUD_HARNESS_HTTP_MAX_SESSIONS`, `…_MAX_SESSIONS_PER_CLIENT` and
    /// `…_SESSION_IDLE` (seconds) overriding them.
    pub fn from_env() -> cloud_harness_fs::Result<Limits> {
        use crate::provision::staging::env_number;
        let d = Limits::default();
        let total = env_number("CLOUD_HARNESS_HTTP_MAX_SESSIONS", d.max_sessions as u64)?;
        let per_client = env_number(
            "CLOUD_HARNESS_HTTP_MAX_SESSIONS_PER_CLIENT",
            d.max_per_client as u64,
        )?;
        let idle = env_number("CLOUD_HARNESS_HTTP_SESSION_IDLE", d.idle.as_secs())?;
        Ok(Limits {
            max_sessions: (total as usize).max(1),
            max_per_client: (per_client as usize).max(1),
            idle: Duration::from_secs(idle.max(1)),
        })
    }
}

/// Why a new session is refused: the HTTP status and the seconds to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub status: u16,
    pub retry_after: u64,
}

#[derive(Default)]
struct Owners {
    /// Live sessions by id, with the client that started them.
    by_id: HashMap<String, IpAddr>,
    /// Admitted `initialize` requests not answered yet, per client.
    pending: HashMap<IpAddr, usize>,
}

pub struct Sessions {
    pub manager: Arc<LocalSessionManager>,
    owners: Mutex<Owners>,
    limits: Limits,
}

impl Sessions {
    pub fn new(limits: Limits) -> Arc<Sessions> {
        let mut manager = LocalSessionManager::default();
        manager.session_config.keep_alive = Some(limits.idle);
        Arc::new(Sessions {
            manager: Arc::new(manager),
            owners: Mutex::new(Owners::default()),
            limits,
        })
    }

    /// Admits a new session from `client`, or says why not. An admitted one must be followed
    /// by [`Sessions::answered`].
    pub async fn admit(&self, client: IpAddr) -> Result<(), Full> {
        let live: Vec<String> = {
            let sessions = self.manager.sessions.read().await;
            sessions.keys().map(|id| id.to_string()).collect()
        };
        let mut owners = self.owners.lock().expect("session owners");
        // Sessions the SDK closed (idle, deleted) are gone from its table.
        let live: std::collections::HashSet<String> = live.into_iter().collect();
        owners.by_id.retain(|id, _| live.contains(id));
        let pending: usize = owners.pending.values().sum();
        if live.len() + pending >= self.limits.max_sessions {
            return Err(Full {
                status: 503,
                retry_after: 5,
            });
        }
        let mine = owners.by_id.values().filter(|ip| **ip == client).count()
            + owners.pending.get(&client).copied().unwrap_or(0);
        if mine >= self.limits.max_per_client {
            return Err(Full {
                status: 429,
                retry_after: 5,
            });
        }
        *owners.pending.entry(client).or_default() += 1;
        Ok(())
    }

    /// The admitted `initialize` of `client` was answered, with a session or without one.
    pub fn answered(&self, client: IpAddr, session: Option<&str>) {
        let mut owners = self.owners.lock().expect("session owners");
        if let Some(n) = owners.pending.get_mut(&client) {
            *n -= 1;
            if *n == 0 {
                owners.pending.remove(&client);
            }
        }
        if let Some(id) = session {
            owners.by_id.insert(id.to_owned(), client);
        }
    }
}
