//! Authentication on the HTTP listener: every request but the login page carries a bearer
//! token or a browser session's cookie; a browser's state-changing request also carries its
//! session's CSRF token and comes from the server's own origin; each path asks for a role.

use super::{Identity, Role};
use crate::state::Db;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cloud_harness_fs::{Code, Error};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a token's check is reused (a revocation by another process takes this long to
/// reach this one; one by this process, none).
pub const CACHE_TTL: Duration = Duration::from_secs(1);
/// How long a checked identity stays good while the database cannot be asked.
pub const STALE_GRACE: Duration = Duration::from_secs(60);
pub const COOKIE: &str = "ch_session";
pub const CSRF_HEADER: &str = "x-csrf-token";

/// Bumped by every revocation in this process: cached checks made before it are void.
static REVOKED: AtomicU64 = AtomicU64::new(0);

pub fn forget_cached() {
    REVOKED.fetch_add(1, Ordering::SeqCst);
}

/// How the listener checks callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Tokens,
    /// `--auth none`: loopback only; every caller is the operator.
    None,
}

pub struct Auth {
    db: Db,
    mode: Mode,
    /// Origins besides the server's own that may send a browser's writes, as the MCP endpoint
    /// takes them (`http://localhost:*`: any port).
    origins: Vec<String>,
    /// The names this server answers to (a browser led here by another name is refused:
    /// DNS rebinding).
    hosts: Vec<String>,
    cache: Mutex<HashMap<String, Checked>>,
}

/// A secret's check: when, in which revocation generation, and what it found.
type Checked = (Instant, u64, Option<Identity>);

impl Auth {
    pub fn new(db: Db, mode: Mode, origins: Vec<String>, hosts: Vec<String>) -> Arc<Auth> {
        Arc::new(Auth {
            db,
            mode,
            origins,
            hosts,
            cache: Mutex::default(),
        })
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The identity of a bearer secret (`cookie`: a browser session's), checked at most once
    /// per [`CACHE_TTL`]. While the database is out of reach, an identity checked within
    /// [`STALE_GRACE`] stays good (none revoked in this process meanwhile), so agents at work
    /// are not cut off by a database's blip; anything that needs the database still fails.
    fn identify(&self, secret: &str, cookie: bool) -> Result<Option<Identity>, Error> {
        let key = format!("{}{secret}", if cookie { "c:" } else { "t:" });
        let generation = REVOKED.load(Ordering::SeqCst);
        let cached = self.cache.lock().expect("auth cache").get(&key).cloned();
        let cached = cached.filter(|(_, g, _)| *g == generation);
        if let Some((at, _, id)) = &cached {
            if at.elapsed() < CACHE_TTL {
                return Ok(id.clone());
            }
        }
        let checked = if cookie {
            super::session(&self.db, secret)
        } else {
            super::authenticate(&self.db, secret)
        };
        let id = match (checked, cached) {
            (Ok(id), _) => id,
            (Err(e), Some((at, _, id)))
                if e.code == Code::Upstream && at.elapsed() < STALE_GRACE =>
            {
                tracing::warn!(error = %e.message, "the database is out of reach: a caller checked in the last minute is let in");
                return Ok(id);
            }
            (Err(e), _) => return Err(e),
        };
        let mut cache = self.cache.lock().expect("auth cache");
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(key, (Instant::now(), generation, id.clone()));
        Ok(id)
    }
}

/// The role a request needs: MCP and the API's reads `client` (a client sees its own
/// workspaces and what they meet), except tokens, the audit log, imports, the acquisition
/// history and the metrics; the dashboard's pages and every write `operator`.
fn required(method: &Method, path: &str) -> Role {
    let reads = matches!(*method, Method::GET | Method::HEAD);
    let operators_only = [
        "/api/v1/tokens",
        "/api/v1/audit",
        "/api/v1/imports",
        "/api/v1/acquisitions",
        "/api/v1/usage",
    ]
    .iter()
    .any(|p| path == *p || path.starts_with(&format!("{p}/")));
    if path == "/mcp"
        || path.starts_with("/mcp/")
        || (path.starts_with("/api/") && reads && !operators_only)
    {
        Role::Client
    } else {
        Role::Operator
    }
}

/// Paths anyone may ask for: the login page, the sign-in hint, the assets and the probes.
fn open(path: &str) -> bool {
    matches!(path, "/login" | "/" | "/healthz" | "/readyz") || path.starts_with("/assets/")
}

/// A page of the dashboard (not the API, MCP or an asset): a browser signed out is sent to
/// the sign-in hint rather than given JSON.
fn is_page(path: &str) -> bool {
    !(path.starts_with("/api/")
        || matches!(path, "/metrics" | "/healthz" | "/readyz")
        || path == "/mcp"
        || path.starts_with("/mcp/")
        || path.starts_with("/assets/"))
}

pub fn error_response(e: &Error) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::json!({
        "code": e.code.as_str(), "status": e.status, "message": e.message, "details": e.details,
    });
    let mut response = (status, axum::Json(body)).into_response();
    if let Some(secs) = crate::limits::retry_after(e) {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if e.code == Code::Unauthenticated {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"cloud-harness\""),
        );
    }
    response
}

pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// Whether `origin` is this server's own (as the browser reached it) or one allowed (a
/// pattern ending in `:*` takes any port).
fn same_origin(headers: &HeaderMap, origin: &str, allowed: &[String]) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let own =
        host.is_some_and(|h| origin == format!("http://{h}") || origin == format!("https://{h}"));
    let matches = |a: &String| match a.strip_suffix(":*") {
        Some(base) => origin.strip_prefix(base).is_some_and(|port| {
            port.strip_prefix(':')
                .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        }),
        None => a == origin,
    };
    own || allowed.iter().any(matches)
}

pub async fn guard(State(auth): State<Arc<Auth>>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    let identity = match check(&auth, &request, &path) {
        Ok(identity) => identity,
        Err(e)
            if e.code == Code::Unauthenticated
                && is_page(&path)
                && request.method() == Method::GET =>
        {
            return Response::builder()
                .status(StatusCode::SEE_OTHER)
                .header(header::LOCATION, "/")
                .body(axum::body::Body::empty())
                .expect("a response");
        }
        Err(e) => return error_response(&e),
    };
    if let Some(id) = identity {
        request.extensions_mut().insert(id);
    }
    next.run(request).await
}

/// The host name of a `Host` header, without its port (an IPv6 address without brackets).
fn host_name(host: &str) -> &str {
    match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => host.split(':').next().unwrap_or(host),
    }
}

fn check(auth: &Auth, request: &Request, path: &str) -> Result<Option<Identity>, Error> {
    let headers = request.headers();
    let method = request.method();
    let writes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) {
        if !auth.hosts.iter().any(|h| h == host_name(host)) {
            return Err(Error::new(
                Code::Forbidden,
                "this server does not answer to that host name",
            ));
        }
    }
    // A page of another site may make a browser send a write (a form, a text/plain fetch):
    // whatever the credentials, a write that names an origin must name this server's.
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    if writes && origin.is_some_and(|o| !same_origin(headers, o, &auth.origins)) {
        return Err(Error::new(
            Code::Forbidden,
            "a browser's write must come from this server's own origin",
        ));
    }
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|n| n != "0");
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if path.starts_with("/api/") && writes && has_body && !json {
        // Only JSON: a cross-site form or text/plain post cannot send it without asking first.
        return Err(Error::new(
            Code::InvalidArgument,
            "the API takes JSON: send Content-Type: application/json",
        ));
    }
    let identity =
        if auth.mode == Mode::None {
            Some(Identity {
                token_id: String::new(),
                name: "anonymous".into(),
                role: Role::Operator,
                csrf: None,
            })
        } else if let Some(value) = headers.get(header::AUTHORIZATION) {
            let secret = value
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .ok_or_else(|| {
                    Error::new(
                        Code::Unauthenticated,
                        "Authorization must be `Bearer <token>`",
                    )
                })?;
            Some(auth.identify(secret.trim(), false)?.ok_or_else(|| {
                Error::new(Code::Unauthenticated, "this token is unknown or revoked")
            })?)
        } else if let Some(secret) = cookie(headers, COOKIE) {
            auth.identify(&secret, true)?
        } else {
            None
        };
    let Some(identity) = identity else {
        if open(path) {
            return Ok(None);
        }
        return Err(Error::new(
            Code::Unauthenticated,
            "sign in: send `Authorization: Bearer <token>` (`cloud-harness token create`), or open a login link (`cloud-harness token login-url`)",
        ));
    };
    if let (Some(csrf), true) = (&identity.csrf, writes) {
        // A cookie rides along on any site's request: a browser's write must come from this
        // server's pages and carry the session's token.
        if origin.is_none() {
            return Err(Error::new(
                Code::Forbidden,
                "a browser's write must come from this server's own origin",
            ));
        }
        // The API and MCP take the token as a header; a dashboard form posts it as a field,
        // which its handler checks.
        let sent = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
        if !is_page(path) && sent != Some(csrf.as_str()) {
            return Err(Error::new(
                Code::Forbidden,
                "a browser's write must carry the session's CSRF token (X-CSRF-Token)",
            ));
        }
    }
    let needed = required(method, path);
    // The dashboard's overview is open to the signed out (it says how to sign in), not to
    // clients signed in.
    if identity.role < needed && !(open(path) && path != "/") {
        return Err(Error::new(
            Code::Forbidden,
            format!(
                "token {:?} has role `{}`; this needs `{}`",
                identity.name,
                identity.role.as_str(),
                needed.as_str()
            ),
        ));
    }
    Ok(Some(identity))
}
