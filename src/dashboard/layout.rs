//! The frame of every page: navigation, who is signed in, the security headers.

use crate::auth::Identity;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};

/// No script at all, styles and forms from this server only, never in a frame.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const NAV: &[(&str, &str)] = &[
    ("/", "Overview"),
    ("/library", "Library"),
    ("/tokens", "Tokens"),
    ("/audit", "Audit"),
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
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    };
    respond(StatusCode::OK, markup)
}

pub fn respond(status: StatusCode, markup: Markup) -> Response {
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
pub fn error(who: &Identity, e: &cloud_harness_fs::Error) -> Response {
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

pub async fn stylesheet() -> Response {
    let mut r = include_str!("app.css").into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        "text/css; charset=utf-8".parse().expect("a header"),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        "max-age=3600".parse().expect("a header"),
    );
    r
}
