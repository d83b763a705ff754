//! Who may call: bearer tokens, stored as SHA-256 hashes (a token is 32 random bytes, so a
//! plain hash is enough: there is nothing to guess), each with a name and a role; one-time
//! login codes that turn into a browser session (a cookie and its CSRF token).
//!
//! It also owns the route-level access policy (which paths need which role, which are pages)
//! and the shapes of its refusals, the JSON-RPC one for `/mcp` among them; it knows nothing
//! of workspaces or toolkits and has no MCP dependency. The MCP transport and the operator API
//! both ask it who a request is.

mod checks;
pub mod http;
mod known;
pub mod pages;
pub mod quotas;

use cloud_harness_control::audit;
use cloud_harness_control::input::shown;
use cloud_harness_control::params;
pub use cloud_harness_control::principal::{Identity, Role};
use cloud_harness_control::state::Optional;
use cloud_harness_control::state::{self, Db};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::Digest;
use serde::Serialize;
use serde_json::json;

/// A token as listings show it (never its secret nor its hash).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub created_at: i64,
    pub created_by: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<i64>,
}

/// A token just made: its secret is shown this once.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewToken {
    #[serde(flatten)]
    pub info: TokenInfo,
    pub token: String,
}

const TOKEN_PREFIX: &str = "cht_";
/// How long a browser session lasts, and a login code keeps.
const SESSION_MS: i64 = 12 * 3600 * 1000;
const LOGIN_CODE_MS: i64 = 24 * 3600 * 1000;

fn hash(secret: &str) -> String {
    Digest::of(secret.as_bytes()).hex()
}

/// Whether a secret sent (a CSRF token) is the one expected, in time that does not depend on
/// where they differ.
pub fn same_secret(sent: &str, expected: &str) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(sent.as_bytes().ct_eq(expected.as_bytes()))
}

/// A token name: 1-64 of letters, digits, `.`, `_`, `-` (it shows in logs and the audit log).
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::field(
            Code::InvalidArgument,
            "name",
            format!(
                "{:?} is not a token name: 1-64 letters, digits, '.', '_' or '-'",
                shown(name)
            ),
        ))
    }
}

fn token_info(r: &state::Row) -> state::DbResult<TokenInfo> {
    let role: String = r.get(2)?;
    Ok(TokenInfo {
        id: r.get(0)?,
        name: r.get(1)?,
        role: if role == "operator" {
            Role::Operator
        } else {
            Role::Client
        },
        created_at: r.get(3)?,
        created_by: r.get(4)?,
        revoked_at: r.get(5)?,
    })
}

/// Makes a token; CONFLICT when an active one has the name.
pub fn create(db: &Db, name: &str, role: Role, actor: &str) -> Result<NewToken> {
    check_name(name)?;
    let secret = format!("{TOKEN_PREFIX}{}", state::secret());
    let info = TokenInfo {
        id: state::new_id("tok"),
        name: name.to_owned(),
        role,
        created_at: state::now_ms(),
        created_by: actor.to_owned(),
        revoked_at: None,
    };
    db.write(|tx| {
        tx.execute(
            "INSERT INTO tokens (id, name, role, hash, created_at, created_by) VALUES ($1, $2, $3, $4, $5, $6)",
            params![info.id, info.name, role.as_str(), hash(&secret), info.created_at, actor],
        )
        .map_err(|e| {
            if state::is_constraint(&e) {
                Error::field(Code::Conflict, "name", format!("a token named {name:?} exists; revoke it first or choose another name"))
            } else {
                state::internal(e)
            }
        })?;
        audit::record(tx, actor, "token.create", &format!("token:{name}"), &json!({ "role": role, "id": info.id }))
    })?;
    known::changed();
    Ok(NewToken {
        info,
        token: secret,
    })
}

/// Every token, active ones first, then by name.
pub fn list(db: &Db, include_revoked: bool) -> Result<Vec<TokenInfo>> {
    db.with(|c| {
        let mut q = c.prepare_cached(
            "SELECT id, name, role, created_at, created_by, revoked_at FROM tokens
             WHERE ($1 OR revoked_at IS NULL) ORDER BY revoked_at IS NOT NULL, name, created_at",
        )?;
        let rows = q.query_map(params![include_revoked], token_info)?;
        rows.collect()
    })
}

/// Revokes the active token named `name`: it stops working at once in this process, within
/// `CACHE_TTL` in others; its browser sessions end.
pub fn revoke(db: &Db, name: &str, actor: &str) -> Result<TokenInfo> {
    let info = db.write(|tx| {
        let now = state::now_ms();
        let info = tx
            .query_row(
                "UPDATE tokens SET revoked_at = $1, revoked_by = $2 WHERE name = $3 AND revoked_at IS NULL
                 RETURNING id, name, role, created_at, created_by, revoked_at",
                params![now, actor, name],
                token_info,
            )
            .optional()
            .map_err(state::internal)?
            .ok_or_else(|| {
                Error::field(Code::NotFound, "name", format!("no active token named {:?}", shown(name)))
            })?;
        tx.execute("DELETE FROM browser_sessions WHERE token_id = $1", params![info.id])
            .map_err(state::internal)?;
        tx.execute("DELETE FROM login_codes WHERE token_id = $1", params![info.id])
            .map_err(state::internal)?;
        audit::record(tx, actor, "token.revoke", &format!("token:{name}"), &json!({ "id": info.id }))?;
        Ok(info)
    })?;
    http::forget_cached();
    Ok(info)
}

/// Whether any token was ever made (the first start makes one when none was).
pub fn any(db: &Db) -> Result<bool> {
    db.with(|c| {
        c.query_row("SELECT EXISTS (SELECT 1 FROM tokens)", params![], |r| {
            r.get(0)
        })
    })
}

/// The identity of an active token's secret.
pub(crate) fn authenticate(db: &Db, secret: &str) -> Result<Option<Identity>> {
    if !secret.starts_with(TOKEN_PREFIX) {
        return Ok(None);
    }
    db.with(|c| {
        c.prepare_cached(
            "SELECT id, name, role FROM tokens WHERE hash = $1 AND revoked_at IS NULL",
        )?
        .query_row(params![hash(secret)], |r| {
            let role: String = r.get(2)?;
            Ok(Identity {
                token_id: r.get(0)?,
                name: r.get(1)?,
                role: Role::parse(&role).unwrap_or(Role::Client),
                csrf: None,
            })
        })
        .optional()
    })
}

/// A one-time login code for the active operator token `name`, valid for a day.
pub fn login_code(db: &Db, name: &str, actor: &str) -> Result<String> {
    let code = state::secret();
    db.write(|tx| {
        let (id, role): (String, String) = tx
            .query_row(
                "SELECT id, role FROM tokens WHERE name = $1 AND revoked_at IS NULL",
                params![name],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(state::internal)?
            .ok_or_else(|| {
                Error::field(
                    Code::NotFound,
                    "name",
                    format!("no active token named {:?}", shown(name)),
                )
            })?;
        if role != "operator" {
            return Err(Error::field(
                Code::InvalidArgument,
                "name",
                format!("token {name:?} is a client token: the dashboard is for operators"),
            ));
        }
        tx.execute(
            "INSERT INTO login_codes (hash, token_id, expires_at) VALUES ($1, $2, $3)",
            params![hash(&code), id, state::now_ms() + LOGIN_CODE_MS],
        )
        .map_err(state::internal)?;
        audit::record(
            tx,
            actor,
            "login.code",
            &format!("token:{name}"),
            &json!({}),
        )
    })?;
    Ok(code)
}

/// A browser session made from a login code (used up by it): its cookie secret and CSRF token.
pub(crate) struct BrowserSession {
    pub secret: String,
    pub csrf: String,
    pub max_age_secs: i64,
}

pub(crate) fn redeem(db: &Db, code: &str) -> Result<BrowserSession> {
    let refused = || {
        Error::new(Code::Unauthenticated, "this login link is unknown, used or expired; make a new one with `cloud-harness token login-url`")
    };
    let session = BrowserSession {
        secret: state::secret(),
        csrf: state::secret(),
        max_age_secs: SESSION_MS / 1000,
    };
    // A code is a secret as `state::secret` makes them; anything else, and a code no one
    // made, is refused by a read, without taking the writer.
    let shaped = code.len() == 43
        && code
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    let known = shaped
        && db.with(|c| {
            c.query_row(
                "SELECT EXISTS (SELECT 1 FROM login_codes WHERE hash = $1)",
                params![hash(code)],
                |r| r.get(0),
            )
        })?;
    if !known {
        return Err(refused());
    }
    db.write(|tx| {
        let now = state::now_ms();
        // Used up by this attempt whether or not it is still valid.
        let found: Option<(String, i64)> = tx
            .query_row(
                "DELETE FROM login_codes WHERE hash = $1 RETURNING token_id, expires_at",
                params![hash(code)],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(state::internal)?;
        let Some((token_id, expires)) = found else {
            return Err(refused());
        };
        if expires < now {
            return Err(refused());
        }
        let name: String = tx
            .query_row(
                "SELECT name FROM tokens WHERE id = $1 AND revoked_at IS NULL",
                params![token_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(state::internal)?
            .ok_or_else(refused)?;
        tx.execute(
            "INSERT INTO browser_sessions (hash, token_id, csrf, created_at, expires_at) VALUES ($1, $2, $3, $4, $5)",
            params![hash(&session.secret), token_id, session.csrf, now, now + SESSION_MS],
        )
        .map_err(state::internal)?;
        tx.execute("DELETE FROM browser_sessions WHERE expires_at < $1", params![now])
            .map_err(state::internal)?;
        audit::record(tx, &format!("token:{name}"), "login", &format!("token:{name}"), &json!({ "via": "browser" }))
    })?;
    known::changed();
    Ok(session)
}

/// The identity of a browser session's cookie secret, with its CSRF token.
pub fn session(db: &Db, secret: &str) -> Result<Option<Identity>> {
    db.with(|c| {
        c.prepare_cached(
            "SELECT t.id, t.name, t.role, s.csrf FROM browser_sessions s JOIN tokens t ON t.id = s.token_id
             WHERE s.hash = $1 AND s.expires_at > $2 AND t.revoked_at IS NULL",
        )?
        .query_row(params![hash(secret), state::now_ms()], |r| {
            let role: String = r.get(2)?;
            Ok(Identity {
                token_id: r.get(0)?,
                name: r.get(1)?,
                role: Role::parse(&role).unwrap_or(Role::Client),
                csrf: Some(r.get(3)?),
            })
        })
        .optional()
    })
}

/// Ends a browser session.
pub fn logout(db: &Db, secret: &str) -> Result<()> {
    db.write(|tx| {
        tx.execute(
            "DELETE FROM browser_sessions WHERE hash = $1",
            params![hash(secret)],
        )
        .map(|_| ())
        .map_err(state::internal)
    })?;
    http::forget_cached();
    Ok(())
}
