//! The frame of every page: navigation, who is signed in, the security headers.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use cloud_harness_auth::http::CSRF_FIELD;
use cloud_harness_auth::Identity;
use maud::{html, Markup, DOCTYPE};

/// Scripts, styles and forms from this server only (no inline script, no `eval`), its API the
/// only thing a script may ask, never in a frame.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const NAV: &[(&str, &str)] = &[
    ("/", "Overview"),
    ("/library", "Library"),
    ("/usage", "Usage"),
    ("/imports", "Imports"),
    ("/sets", "Sets"),
    ("/registry", "Registry"),
    ("/conflicts", "Conflicts"),
    ("/approvals", "Approvals"),
    ("/workspaces", "Workspaces"),
    ("/audit", "Audit"),
    ("/tokens", "Tokens"),
];

pub fn page(title: &str, current: &str, who: &Identity, body: Markup) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Cloud Harness" }
                link rel="stylesheet" href="/assets/app.css";
                script src="/assets/live.js" defer {}
            }
            body {
                header {
                    nav aria-label="Main" {
                        span.brand { "Cloud Harness" }
                        ul {
                            @for (href, label) in NAV {
                                li {
                                    @if *href == current {
                                        a href=(href) aria-current="page" { (label) }
                                    } @else {
                                        a href=(href) { (label) }
                                    }
                                }
                            }
                        }
                        span.who { (who.name) " (" (who.role.as_str()) ")" }
                        @if who.csrf.is_some() {
                            form.signout method="post" action="/logout" {
                                (csrf(who))
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    };
    respond(StatusCode::OK, markup)
}

pub(crate) fn respond(status: StatusCode, markup: Markup) -> Response {
    let mut r = (status, markup.into_string()).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        "text/html; charset=utf-8".parse().expect("a header"),
    );
    h.insert("content-security-policy", CSP.parse().expect("a header"));
    h.insert(
        "x-content-type-options",
        "nosniff".parse().expect("a header"),
    );
    // `no-referrer` would make a browser send `Origin: null` with our own forms.
    h.insert("referrer-policy", "same-origin".parse().expect("a header"));
    r
}

/// An error as a page: what went wrong and what to fix.
pub fn error(who: &Identity, e: &cloud_harness_error::Error) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = page(
        "Something went wrong",
        "",
        who,
        html! {
            p role="alert" { strong { (e.code.as_str()) } ": " (e.message) }
            p { a href="/" { "Back to the overview" } }
        },
    );
    *r.status_mut() = status;
    r
}

/// A form's CSRF field: the session's token.
pub fn csrf(who: &Identity) -> Markup {
    html! { input type="hidden" name=(CSRF_FIELD) value=(who.csrf.as_deref().unwrap_or_default()); }
}

/// Whether `who` may use the page's forms (the pages show them to operators only).
pub fn operator(who: &Identity) -> bool {
    who.role >= cloud_harness_auth::Role::Operator
}

/// An error where a form shows it: the code and what to fix.
pub fn alert(e: &cloud_harness_error::Error) -> Markup {
    html! { p.error role="alert" { strong { (e.code.as_str()) } ": " (e.message) } }
}

/// The message of `e` when it names `field` (or a field inside it), shown beside that field.
pub(crate) fn field_error(e: Option<&cloud_harness_error::Error>, field: &str) -> Markup {
    let at = e.filter(|e| {
        e.details["field"].as_str().is_some_and(|f| {
            f == field || f.starts_with(&format!("{field}.")) || f.starts_with(&format!("{field}["))
        })
    });
    html! { @if let Some(e) = at { span.field-error role="alert" { (e.message) } } }
}

/// A commit or digest as people read it: its first 12 digits.
pub fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

/// A time in ms since the epoch, as people read it (UTC).
pub fn when(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    httpdate::fmt_http_date(at)
}

pub async fn stylesheet() -> Response {
    asset(include_str!("app.css"), "text/css; charset=utf-8")
}

/// The one script: live progress of import jobs and opening workspaces (the pages work without it).
pub async fn script() -> Response {
    asset(include_str!("live.js"), "text/javascript; charset=utf-8")
}

fn asset(text: &'static str, kind: &'static str) -> Response {
    let mut r = text.into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, kind.parse().expect("a header"));
    r.headers_mut().insert(
        "x-content-type-options",
        "nosniff".parse().expect("a header"),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        "max-age=3600".parse().expect("a header"),
    );
    r
}
