//! Authentication on the HTTP listener: every request but the login page carries a bearer
//! token or a browser session's cookie; a browser's state-changing request also carries its
//! session's CSRF token and comes from the server's own origin; each path asks for a role.

use super::{Identity, Role};
use crate::state::Db;
use axum::extract::{Query, Request, State};
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
    /// Origins besides the server's own that may send a browser's writes.
    origins: Vec<String>,
    cache: Mutex<HashMap<String, Checked>>,
}

/// A secret's check: when, in which revocation generation, and what it found.
type Checked = (Instant, u64, Option<Identity>);

impl Auth {
    pub fn new(db: Db, mode: Mode, origins: Vec<String>) -> Arc<Auth> {
        Arc::new(Auth {
            db,
            mode,
            origins,
            cache: Mutex::default(),
        })
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The identity of a bearer secret (`cookie`: a browser session's), checked at most once
    /// per [`CACHE_TTL`].
    fn identify(&self, secret: &str, cookie: bool) -> Result<Option<Identity>, Error> {
        let key = format!("{}{secret}", if cookie { "c:" } else { "t:" });
        let generation = REVOKED.load(Ordering::SeqCst);
        if let Some((at, g, id)) = self.cache.lock().expect("auth cache").get(&key) {
            if *g == generation && at.elapsed() < CACHE_TTL {
                return Ok(id.clone());
            }
        }
        let id = if cookie {
            super::session(&self.db, secret)?
        } else {
            super::authenticate(&self.db, secret)?
        };
        let mut cache = self.cache.lock().expect("auth cache");
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(key, (Instant::now(), generation, id.clone()));
        Ok(id)
    }
}

/// The role a request needs: the MCP tools and the API's reads `client`, except the tokens and
/// the audit log; every write `operator`.
fn required(method: &Method, path: &str) -> Role {
    let reads = matches!(*method, Method::GET | Method::HEAD);
    let sensitive = ["/api/v1/tokens", "/api/v1/audit"]
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/")));
    if path == "/mcp" || path.starts_with("/mcp/") || (reads && !sensitive) {
        Role::Client
    } else {
        Role::Operator
    }
}

/// Paths anyone may ask for: the login page and the sign-in hint.
fn open(path: &str) -> bool {
    matches!(path, "/login" | "/")
}

pub fn error_response(e: &Error) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::json!({
        "code": e.code.as_str(), "status": e.status, "message": e.message, "details": e.details,
    });
    let mut response = (status, axum::Json(body)).into_response();
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

/// Whether `origin` is this server's own (as the browser reached it) or one allowed.
fn same_origin(headers: &HeaderMap, origin: &str, allowed: &[String]) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let own =
        host.is_some_and(|h| origin == format!("http://{h}") || origin == format!("https://{h}"));
    own || allowed.iter().any(|a| a == origin)
}

pub async fn guard(State(auth): State<Arc<Auth>>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    let identity = match check(&auth, &request, &path) {
        Ok(identity) => identity,
        Err(e) => return error_response(&e),
    };
    if let Some(id) = identity {
        request.extensions_mut().insert(id);
    }
    next.run(request).await
}

fn check(auth: &Auth, request: &Request, path: &str) -> Result<Option<Identity>, Error> {
    let headers = request.headers();
    let method = request.method();
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
    let writes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if let (Some(csrf), true) = (&identity.csrf, writes) {
        // A cookie rides along on any site's request: a browser's write must come from this
        // server's pages and carry the session's token.
        let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        if !origin.is_some_and(|o| same_origin(headers, o, &auth.origins)) {
            return Err(Error::new(
                Code::Forbidden,
                "a browser's write must come from this server's own origin",
            ));
        }
        let sent = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
        if sent != Some(csrf.as_str()) {
            return Err(Error::new(
                Code::Forbidden,
                "a browser's write must carry the session's CSRF token (X-CSRF-Token)",
            ));
        }
    }
    let needed = required(method, path);
    if identity.role < needed && !open(path) {
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

#[derive(serde::Deserialize)]
pub struct LoginQuery {
    code: Option<String>,
}

/// `GET /login?code=…`: a one-time code becomes a browser session.
pub async fn login(State(auth): State<Arc<Auth>>, Query(q): Query<LoginQuery>) -> Response {
    let Some(code) = q.code.filter(|c| c.len() <= 128) else {
        return error_response(&Error::field(
            Code::InvalidArgument,
            "code",
            "a login link carries `code`",
        ));
    };
    let db = auth.db.clone();
    let session = match tokio::task::spawn_blocking(move || super::redeem(&db, &code)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return error_response(&e),
        Err(e) => return error_response(&Error::internal(e.to_string())),
    };
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        session.secret, session.max_age_secs
    );
    Response::builder()
        .status(StatusCode::SEE_OTHER)
        .header(header::LOCATION, "/")
        .header(header::SET_COOKIE, cookie)
        .body(axum::body::Body::empty())
        .expect("a response")
}

/// `POST /logout`: ends the browser session (a write: origin and CSRF checked).
pub async fn logout(State(auth): State<Arc<Auth>>, headers: HeaderMap) -> Response {
    if let Some(secret) = cookie(&headers, COOKIE) {
        let db = auth.db.clone();
        let _ = tokio::task::spawn_blocking(move || super::logout(&db, &secret)).await;
    }
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .header(
            header::SET_COOKIE,
            format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
        )
        .body(axum::body::Body::empty())
        .expect("a response")
}

/// `/login`, `/logout` and `/`: the pages of signing in.
pub fn pages(auth: Arc<Auth>) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/login", get(login))
        .route("/logout", post(logout))
        .route("/", get(home))
        .with_state(auth)
}

/// `/`: who is signed in, or how to sign in.
async fn home(identity: Option<axum::Extension<Identity>>) -> Response {
    let body = match identity {
        Some(axum::Extension(id)) => format!(
            "<p>Signed in as <b>{}</b> ({}).</p><p>The API: <a href=\"/api/v1/openapi.json\">/api/v1/openapi.json</a>; MCP: <code>/mcp</code>.</p>",
            html_escape(&id.name),
            id.role.as_str()
        ),
        None => "<p>Not signed in. Open the login link <code>cloud-harness serve --http</code> printed at its first start, or make one with <code>cloud-harness token login-url</code>.</p>".to_owned(),
    };
    Response::builder()
        .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
        .header("content-security-policy", "default-src 'none'")
        .body(axum::body::Body::from(format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>Cloud Harness</title></head><body><h1>Cloud Harness</h1>{body}</body></html>"
        )))
        .expect("a response")
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
