//! Sessions of the 2025-11-25 protocol over HTTP, bounded: each `initialize` keeps a session
//! (tens of KB) until it is closed or idle, so a client looping on `initialize` would grow the
//! server without end. Sessions are capped in all and per principal (`[limits] sessions`: one
//! principal's sessions never use up another's, whatever address each comes from); one more
//! is answered 503 (the server is full) or 429 (this principal has its share), with
//! `Retry-After`, and idle sessions close after a minute instead of the SDK's five.

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_sessions: usize,
    /// Sessions of one principal.
    pub max_per_principal: usize,
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sessions: 1000,
            max_per_principal: 100,
            idle: Duration::from_secs(60),
        }
    }
}

impl Limits {
    /// The defaults, with `CLOUD_HARNESS_HTTP_MAX_SESSIONS`, `…_SESSION_IDLE` (seconds) and
    /// the principal's quota (`CLOUD_HARNESS_LIMIT_SESSIONS`) overriding them.
    pub fn from_env() -> cloud_harness_error::Result<Limits> {
        use cloud_harness_control::config::env_number;
        let d = Limits::default();
        let total = env_number("CLOUD_HARNESS_HTTP_MAX_SESSIONS", d.max_sessions as u64)?;
        let idle = env_number("CLOUD_HARNESS_HTTP_SESSION_IDLE", d.idle.as_secs())?;
        Ok(Limits {
            max_sessions: (total as usize).max(1),
            max_per_principal: cloud_harness_control::limits::Limits::from_env()?.sessions as usize,
            idle: Duration::from_secs(idle.max(1)),
        })
    }
}

/// The sessions of the HTTP endpoint serving now, for counting them per principal.
static SERVING: Mutex<Weak<Sessions>> = Mutex::new(Weak::new());

/// Live sessions (and ones being made) per principal, on the endpoint serving now.
pub fn per_principal() -> HashMap<String, usize> {
    let Some(sessions) = SERVING.lock().expect("serving lock").upgrade() else {
        return HashMap::new();
    };
    let owners = sessions.owners.lock().expect("session owners");
    let mut counts = owners.pending.clone();
    for who in owners.by_id.values() {
        *counts.entry(who.clone()).or_default() += 1;
    }
    counts
}

/// Why a new session is refused: the HTTP status and the seconds to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub status: u16,
    pub retry_after: u64,
}

#[derive(Default)]
struct Owners {
    /// Live sessions by id, with the principal that started them.
    by_id: HashMap<String, String>,
    /// Admitted `initialize` requests not answered yet, per principal.
    pending: HashMap<String, usize>,
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
        // A finished call's answer (up to a MiB) is kept for a late resume this long, not the
        // SDK's minute: a client dropping its calls as it makes them cannot pile answers up.
        manager.session_config.completed_cache_ttl = Duration::from_secs(5);
        let sessions = Arc::new(Sessions {
            manager: Arc::new(manager),
            owners: Mutex::new(Owners::default()),
            limits,
        });
        *SERVING.lock().expect("serving lock") = Arc::downgrade(&sessions);
        sessions
    }

    /// Admits a new session of the principal `who`, or says why not. The admission counts
    /// against `who` until it is [`Admission::answered`] or dropped (a client gone before the
    /// answer leaves nothing counted).
    pub async fn admit(self: &Arc<Self>, who: &str) -> Result<Admission, Full> {
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
        let mine = owners.by_id.values().filter(|w| *w == who).count()
            + owners.pending.get(who).copied().unwrap_or(0);
        if mine >= self.limits.max_per_principal {
            cloud_harness_control::limits::refused("sessions");
            return Err(Full {
                status: 429,
                retry_after: 5,
            });
        }
        *owners.pending.entry(who.to_owned()).or_default() += 1;
        Ok(Admission {
            sessions: self.clone(),
            who: who.to_owned(),
        })
    }

    /// Counts a session the SDK made for `who` without an admission (a message it read as
    /// `initialize` that the guard did not); over the caps, the session is closed again.
    pub async fn adopt(self: &Arc<Self>, who: &str, id: &str) -> Result<(), Full> {
        if self
            .owners
            .lock()
            .expect("session owners")
            .by_id
            .contains_key(id)
        {
            return Ok(());
        }
        let admission = match self.admit(who).await {
            Ok(admission) => admission,
            Err(full) => {
                let _ = self.manager.close_session(&Arc::from(id)).await;
                return Err(full);
            }
        };
        admission.answered(Some(id));
        Ok(())
    }

    /// Whether the session `id` is one a principal other than `who` started (a session is
    /// its starter's: another caller holding its id is answered as if it did not exist).
    pub(crate) fn someone_elses(&self, id: &str, who: &str) -> bool {
        let owners = self.owners.lock().expect("session owners");
        owners.by_id.get(id).is_some_and(|owner| owner != who)
    }

    fn settle(&self, who: &str, session: Option<&str>) {
        let mut owners = self.owners.lock().expect("session owners");
        if let Some(n) = owners.pending.get_mut(who) {
            *n -= 1;
            if *n == 0 {
                owners.pending.remove(who);
            }
        }
        if let Some(id) = session {
            owners.by_id.insert(id.to_owned(), who.to_owned());
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }
}

/// An `initialize` admitted and not answered yet.
pub struct Admission {
    sessions: Arc<Sessions>,
    who: String,
}

impl Admission {
    /// It was answered, with a session or without one.
    pub fn answered(self, session: Option<&str>) {
        self.sessions.settle(&self.who, session);
        std::mem::forget(self);
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.sessions.settle(&self.who, None);
    }
}
