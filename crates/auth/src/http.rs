//! Authentication on the HTTP listener: every request but the login page carries a bearer
//! token or a browser session's cookie; a browser's state-changing request also carries its
//! session's CSRF token and comes from the exact origin the dashboard is served from; each
//! path asks for a role. A request that names no host (`Host`), or a host this server does not
//! answer to, is refused before anything else.

use super::checks::{Checks, Kind};
use super::{Identity, Role};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cloud_harness_control::state::Db;
use cloud_harness_error::{Code, Error};
use std::sync::Arc;

pub(crate) use super::checks::forget_cached;

/// The browser session's cookie: `__Host-` makes the browser keep it only when it is Secure,
/// for this host alone (no `Domain`) and every path.
pub(crate) const COOKIE: &str = "__Host-ch_session";
pub(crate) const CSRF_HEADER: &str = "x-csrf-token";
/// The field a dashboard form sends the CSRF token in.
pub const CSRF_FIELD: &str = "csrf";
/// The largest form body read for its CSRF field (axum's own limit on forms).
const MAX_FORM: usize = 2 << 20;

/// How the listener checks callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Tokens,
    /// `--auth none`: loopback only; every caller is the operator.
    None,
}

pub struct Auth {
    db: Db,
    checks: Arc<Checks>,
    mode: Mode,
    /// Origins besides the server's own that may send a bearer client's writes, as the MCP
    /// endpoint takes them (`http://localhost:*`: any port). Never a browser session's.
    origins: Vec<String>,
    /// The names this server answers to (a browser led here by another name is refused:
    /// DNS rebinding).
    hosts: Vec<String>,
    /// The origin browsers reach the dashboard at through a proxy in front
    /// (`http.public_origin`); without it, `http://<Host>`.
    public_origin: Option<String>,
}

impl Auth {
    pub fn new(
        db: Db,
        mode: Mode,
        origins: Vec<String>,
        hosts: Vec<String>,
        public_origin: Option<String>,
    ) -> Arc<Auth> {
        Arc::new(Auth {
            checks: Checks::new(db.clone()),
            db,
            mode,
            origins,
            hosts,
            public_origin,
        })
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The one origin a browser session's writes may come from: the configured public one,
    /// else this server as the browser reached it (plain HTTP: it serves no TLS itself).
    fn own_origin(&self, host: &str) -> String {
        match &self.public_origin {
            Some(o) => o.clone(),
            None => format!("http://{host}"),
        }
    }
}

/// `http.public_origin` as browsers write an origin (`https://harness.example.com`, a port
/// only when not the scheme's own), or why it is not one.
pub fn parse_public_origin(text: &str) -> Result<String, Error> {
    let refused = |why: &str| {
        Error::field(
            Code::InvalidArgument,
            "http.public_origin",
            format!(
                "{:?} is not an origin ({why}): scheme://host[:port], e.g. https://harness.example.com",
                cloud_harness_control::input::shown(text)
            ),
        )
    };
    let url = url::Url::parse(text).map_err(|e| refused(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refused("http or https"));
    }
    if url.path() != "/"
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
        || url.password().is_some()
    {
        return Err(refused("no path, query or user"));
    }
    let origin = url.origin().ascii_serialization();
    if !text.trim_end_matches('/').eq_ignore_ascii_case(&origin) {
        // The scheme's own port, or a name the URL parser rewrote: say it as browsers do.
        return Err(refused(&format!("write it {origin}")));
    }
    Ok(origin)
}

/// The role a request needs: MCP and the API's reads `client` (a client sees its own
/// workspaces and what they meet), except tokens, the audit log, imports, the acquisition
/// history, inventories (they name every principal's workspaces) and the metrics; the dashboard's pages and every write `operator`.
fn required(method: &Method, path: &str) -> Role {
    let reads = matches!(*method, Method::GET | Method::HEAD);
    let operators_only = [
        "/api/v1/tokens",
        "/api/v1/audit",
        "/api/v1/imports",
        "/api/v1/acquisitions",
        "/api/v1/inventory",
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
    if let Some(secs) = cloud_harness_control::limits::retry_after(e) {
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
    if e.details["retryable"] == true {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// Whether `origin` is this server's own (as the browser reached it), the public one, or one
/// allowed (a pattern ending in `:*` takes any port).
fn same_origin(auth: &Auth, host: &str, origin: &str) -> bool {
    let own = origin == format!("http://{host}")
        || origin == format!("https://{host}")
        || auth.public_origin.as_deref() == Some(origin);
    let matches = |a: &String| match a.strip_suffix(":*") {
        Some(base) => origin.strip_prefix(base).is_some_and(|port| {
            port.strip_prefix(':')
                .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        }),
        None => a == origin,
    };
    own || auth.origins.iter().any(matches)
}

pub async fn guard(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    let get = request.method() == Method::GET;
    match check(&auth, request, &path).await {
        Ok(request) => next.run(request).await,
        Err(e) if e.code == Code::Unauthenticated && is_page(&path) && get => Response::builder()
            .status(StatusCode::SEE_OTHER)
            .header(header::LOCATION, "/")
            .body(Body::empty())
            .expect("a response"),
        Err(e) => error_response(&e),
    }
}

/// The host name of a `Host` header, without its port (an IPv6 address without brackets).
fn host_name(host: &str) -> &str {
    match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => host.split(':').next().unwrap_or(host),
    }
}

/// What a request presents as its caller.
enum Credential {
    None,
    Bearer(String),
    Cookie(String),
}

fn forbidden(message: impl Into<String>) -> Error {
    Error::new(Code::Forbidden, message)
}

/// The credential a request presents: a bearer token first, else the session's cookie.
fn credential(headers: &HeaderMap) -> Result<Credential, Error> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
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
        return Ok(Credential::Bearer(secret.trim().to_owned()));
    }
    Ok(match cookie(headers, COOKIE) {
        Some(secret) => Credential::Cookie(secret),
        None => Credential::None,
    })
}

/// A browser session's write, let through only from the dashboard's exact origin and with
/// the session's CSRF token `csrf` (a header, or a form's field: the form is read for it and
/// handed on whole). A cookie rides along on any site's request, and every page on this
/// machine is "same-site": neither SameSite nor a loopback origin says who sent it.
async fn browser_write(
    auth: &Auth,
    request: Request,
    host: &str,
    origin: Option<&str>,
    csrf: &str,
) -> Result<Request, Error> {
    let own = auth.own_origin(host);
    if origin != Some(own.as_str()) {
        return Err(forbidden(format!(
            "a browser's write must come from the origin the dashboard is served from ({own})"
        )));
    }
    // (Read before any await: a borrowed request would make this future not Send.)
    let headers = request.headers();
    let in_header = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
    let (sent, request) = match in_header {
        Some(sent) => (Some(sent), request),
        None if form => {
            let (parts, body) = request.into_parts();
            let bytes = axum::body::to_bytes(body, MAX_FORM)
                .await
                .map_err(|_| Error::too_large(format!("a form is at most {MAX_FORM} bytes")))?;
            let sent = form_urlencoded::parse(&bytes)
                .find(|(k, _)| k == CSRF_FIELD)
                .map(|(_, v)| v.into_owned());
            (sent, Request::from_parts(parts, Body::from(bytes)))
        }
        None => (None, request),
    };
    if !sent.is_some_and(|s| super::same_secret(&s, csrf)) {
        return Err(forbidden(
            "a browser's write must carry the session's CSRF token (X-CSRF-Token, or the form's csrf field): reload the page and try again",
        ));
    }
    Ok(request)
}

/// The request, let through with its caller's [`Identity`] in its extensions, or why not.
async fn check(auth: &Arc<Auth>, request: Request, path: &str) -> Result<Request, Error> {
    let headers = request.headers();
    let method = request.method().clone();
    let writes = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    // HTTP/1.1 requires it; without it there is no telling which site a browser meant.
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            Error::new(
                Code::InvalidArgument,
                "a request must name the host it is for: send a Host header",
            )
        })?
        .to_owned();
    if !auth.hosts.iter().any(|h| h == host_name(&host)) {
        return Err(forbidden("this server does not answer to that host name"));
    }
    // The probes answer everyone alike: whatever credentials came along, none is checked
    // (a check may wait on the database; a probe must not).
    if matches!(path, "/healthz" | "/readyz") {
        return Ok(request);
    }
    // A page of another site may make a browser send a write (a form, a text/plain fetch):
    // whatever the credentials, a write that names an origin must name this server's.
    let origin = headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if writes
        && origin
            .as_deref()
            .is_some_and(|o| !same_origin(auth, &host, o))
    {
        return Err(forbidden(
            "a browser's write must come from this server's own origin",
        ));
    }
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|n| n != "0");
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if path.starts_with("/api/")
        && writes
        && has_body
        && !content_type.starts_with("application/json")
    {
        // Only JSON: a cross-site form or text/plain post cannot send it without asking first.
        return Err(Error::new(
            Code::InvalidArgument,
            "the API takes JSON: send Content-Type: application/json",
        ));
    }
    let credential = credential(headers)?;
    let identity = if auth.mode == Mode::None {
        Some(Identity {
            token_id: String::new(),
            name: "anonymous".into(),
            role: Role::Operator,
            csrf: None,
        })
    } else {
        match credential {
            Credential::Bearer(secret) => Some(
                auth.checks
                    .identify(&secret, Kind::Token)
                    .await?
                    .ok_or_else(|| {
                        Error::new(Code::Unauthenticated, "this token is unknown or revoked")
                    })?,
            ),
            Credential::Cookie(secret) => auth.checks.identify(&secret, Kind::Cookie).await?,
            Credential::None => None,
        }
    };
    let Some(identity) = identity else {
        if open(path) {
            return Ok(request);
        }
        return Err(Error::new(
            Code::Unauthenticated,
            "sign in: send `Authorization: Bearer <token>` (`cloud-harness token create`), or open a login link (`cloud-harness token login-url`)",
        ));
    };
    let mut request = request;
    if let (Some(csrf), true) = (&identity.csrf, writes) {
        request = browser_write(auth, request, &host, origin.as_deref(), csrf).await?;
    }
    let needed = required(&method, path);
    // The dashboard's overview is open to the signed out (it says how to sign in), not to
    // clients signed in.
    if identity.role < needed && !(open(path) && path != "/") {
        return Err(forbidden(format!(
            "token {:?} has role `{}`; this needs `{}`",
            identity.name,
            identity.role.as_str(),
            needed.as_str()
        )));
    }
    request.extensions_mut().insert(identity);
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_origin_is_written_as_browsers_write_it() {
        let ok = |t: &str| parse_public_origin(t).unwrap();
        assert_eq!(
            ok("https://harness.example.com"),
            "https://harness.example.com"
        );
        assert_eq!(
            ok("https://harness.example.com/"),
            "https://harness.example.com"
        );
        assert_eq!(ok("https://h.example:8443"), "https://h.example:8443");
        assert_eq!(
            ok("https://HARNESS.example.com"),
            "https://harness.example.com"
        );
        for bad in [
            "harness.example.com",
            "https://harness.example.com/dashboard",
            "https://harness.example.com:443",
            "ftp://harness.example.com",
            "https://user@harness.example.com",
            "https://harness.example.com?x=1",
        ] {
            let e = parse_public_origin(bad).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{bad}");
            assert!(e.message.contains("http.public_origin"), "{bad}: {e}");
        }
    }

    #[test]
    fn csrf_tokens_are_compared_whole() {
        let token = cloud_harness_control::state::secret();
        assert!(super::super::same_secret(&token, &token));
        let mut last = token.clone();
        last.pop();
        assert!(!super::super::same_secret(&last, &token));
        assert!(!super::super::same_secret(&format!("{last}!"), &token));
        assert!(!super::super::same_secret("", &token));
    }

    #[test]
    fn host_names_lose_their_port() {
        assert_eq!(host_name("127.0.0.1:8765"), "127.0.0.1");
        assert_eq!(host_name("[::1]:8765"), "::1");
        assert_eq!(host_name("localhost"), "localhost");
    }
}
