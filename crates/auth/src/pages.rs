//! The pages of signing in: `/login?code=…` (a one-time code becomes a browser session),
//! and `/logout`.

use super::http::{cookie, error_response, Auth, COOKIE};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use cloud_harness_error::{Code, Error};
use std::sync::Arc;

/// Login links redeemed at once (by anyone: the page needs no credentials).
const LOGINS_AT_ONCE: usize = 2;

#[derive(serde::Deserialize)]
pub(crate) struct LoginQuery {
    code: Option<String>,
}

/// `GET /login?code=…`: a one-time code becomes a browser session.
pub(crate) async fn login(State(auth): State<Arc<Auth>>, Query(q): Query<LoginQuery>) -> Response {
    let Some(code) = q.code.filter(|c| c.len() <= 128) else {
        return error_response(&Error::field(
            Code::InvalidArgument,
            "code",
            "a login link carries `code`",
        ));
    };
    // Anyone may knock here: a few redemptions at once, the rest told to come back, so a
    // flood of made-up codes cannot fill the blocking pool or queue on the database's writer.
    static REDEEMING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(LOGINS_AT_ONCE);
    let Ok(_turn) = REDEEMING.try_acquire() else {
        return error_response(&cloud_harness_control::limits::exceeded(
            "logins_at_once",
            LOGINS_AT_ONCE as u64,
            std::time::Duration::from_secs(1),
            "the server is redeeming other login links",
        ));
    };
    let db = auth.db().clone();
    let session =
        match cloud_harness_memory::idle::spawn_blocking(move || super::redeem(&db, &code)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return error_response(&e),
            Err(e) => return error_response(&Error::internal(e.to_string())),
        };
    // Secure: browsers keep it from http://localhost and 127.0.0.1 too (loopback is a secure
    // context); anywhere else the dashboard is served over HTTPS (a proxy in front).
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age={}",
        session.secret, session.max_age_secs
    );
    Response::builder()
        .status(StatusCode::SEE_OTHER)
        .header(header::LOCATION, "/")
        .header(header::SET_COOKIE, cookie)
        .body(axum::body::Body::empty())
        .expect("a response")
}

/// `POST /logout`: ends the browser session (a write: the guard checked its origin and CSRF
/// token) and goes back to the sign-in hint.
pub(crate) async fn logout(State(auth): State<Arc<Auth>>, headers: HeaderMap) -> Response {
    if let Some(secret) = cookie(&headers, COOKIE) {
        let db = auth.db().clone();
        let ended =
            cloud_harness_memory::idle::spawn_blocking(move || super::logout(&db, &secret)).await;
        match ended {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return error_response(&e),
            Err(e) => return error_response(&Error::internal(e.to_string())),
        }
    }
    Response::builder()
        .status(StatusCode::SEE_OTHER)
        .header(header::LOCATION, "/")
        .header(
            header::SET_COOKIE,
            format!("{COOKIE}=; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age=0"),
        )
        .body(axum::body::Body::empty())
        .expect("a response")
}

/// `/login`, `/logout` and `/`: the pages of signing in.
pub fn router(auth: Arc<Auth>) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/login", get(login))
        .route("/logout", post(logout))
        .with_state(auth)
}
