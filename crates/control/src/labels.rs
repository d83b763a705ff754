//! Version labels as toolkits resolve them: a name (`stable`, `canary`, any) on a registry
//! entry or a set that points at one of its commits (or revisions), and may serve another to a
//! stated share of new workspaces (a canary). Moving one is `curation::labels`; this is the
//! value and the choice an open makes.

use crate::params;
use crate::state::{self, Db, Optional};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::Digest;
use serde::Serialize;
use std::collections::BTreeMap;

/// The longest label name.
pub const MAX_NAME: usize = 64;

/// Where a label points now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Point {
    /// The label's revision: 1 when made, one more at each move.
    pub revision: i64,
    /// A commit of the entry, or a revision of the set (as text).
    pub value: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,
}

/// What a share of new workspaces gets instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Canary {
    pub value: String,
    /// 1-99: of the new workspaces, about this many in a hundred.
    pub percent: u8,
}

/// What an open took of a label, kept in its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Taken {
    pub name: String,
    pub revision: i64,
    /// The canary's value, not the label's own.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub canary: bool,
}

impl Point {
    /// The value an open takes: the canary's when `seed` falls in its share, else the label's.
    /// No seed (a preview, a set's check): the label's own.
    pub fn pick(&self, target: &str, name: &str, seed: Option<&str>) -> (&str, Taken) {
        let canary = match (&self.canary, seed) {
            (Some(c), Some(seed)) if in_share(target, name, seed, c.percent) => Some(c),
            _ => None,
        };
        let taken = Taken {
            name: name.to_owned(),
            revision: self.revision,
            canary: canary.is_some(),
        };
        (canary.map_or(&self.value, |c| &c.value), taken)
    }
}

/// Whether `seed` (an open's owner and idempotency key) is among the `percent` in a hundred
/// of the label's canary. Hashed with the label, not its revision: raising the share keeps
/// every workspace that had the canary on it, and the same request always lands the same way.
pub fn in_share(target: &str, name: &str, seed: &str, percent: u8) -> bool {
    let d = Digest::of(format!("{target}\n{name}\n{seed}").as_bytes());
    let n = u64::from_be_bytes(d.0[..8].try_into().expect("8 bytes"));
    n % 100 < u64::from(percent)
}

/// A label name: 1-64 lowercase letters, digits, `.`, `_` and `-`, starting with a letter or
/// digit.
pub fn check_name(field: &str, name: &str) -> Result<()> {
    let ok = (1..=MAX_NAME).contains(&name.len())
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(Error::field(
            Code::InvalidArgument,
            field,
            format!(
                "{:?} is not a label: 1-{MAX_NAME} lowercase letters, digits, '.', '_' and '-'",
                crate::input::shown(name)
            ),
        ))
    }
}

/// Where a registry entry's labels are kept: `registry:<id>`; a set's: `set:<id>`.
pub fn entry_target(id: &str) -> String {
    format!("registry:{id}")
}

pub fn set_target(id: &str) -> String {
    format!("set:{id}")
}

/// A label's current point from its row; none once removed.
pub fn point_of(r: &state::Row) -> state::DbResult<Option<Point>> {
    let Some(value) = r.get::<Option<String>>("value")? else {
        return Ok(None);
    };
    let canary = match r.get::<Option<String>>("canary_value")? {
        Some(value) => Some(Canary {
            value,
            percent: u8::try_from(r.get::<i64>("canary_percent")?).unwrap_or(0),
        }),
        None => None,
    };
    Ok(Some(Point {
        revision: r.get("revision")?,
        value,
        canary,
    }))
}

/// Every registry entry's labels as they point now, by entry id.
pub fn of_entries(db: &Db) -> Result<BTreeMap<String, BTreeMap<String, Point>>> {
    let rows = db.with(|c| {
        c.prepare_cached(
            "SELECT target, name, revision, value, canary_value, canary_percent FROM labels
             WHERE superseded_at IS NULL AND target LIKE 'registry:%' AND value IS NOT NULL",
        )?
        .query_map(params![], |r| {
            Ok((
                r.get::<String>("target")?,
                r.get::<String>("name")?,
                point_of(r)?,
            ))
        })?
        .collect::<state::DbResult<Vec<_>>>()
    })?;
    let mut out: BTreeMap<String, BTreeMap<String, Point>> = BTreeMap::new();
    for (target, name, point) in rows {
        if let (Some(id), Some(point)) = (target.strip_prefix("registry:"), point) {
            out.entry(id.to_owned()).or_default().insert(name, point);
        }
    }
    Ok(out)
}

/// The label `name` of `target` as it points now.
pub fn current(db: &Db, target: &str, name: &str) -> Result<Option<Point>> {
    let row = db.with(|c| {
        c.prepare_cached(
            "SELECT revision, value, canary_value, canary_percent FROM labels
             WHERE target = $1 AND name = $2 AND superseded_at IS NULL",
        )?
        .query_row(params![target, name], point_of)
        .optional()
    })?;
    Ok(row.flatten())
}

/// The label's newest revision (0: it was never made).
pub fn current_revision(db: &Db, target: &str, name: &str) -> Result<i64> {
    db.with(|c| {
        c.query_row(
            "SELECT COALESCE(MAX(revision), 0) FROM labels WHERE target = $1 AND name = $2",
            params![target, name],
            |r| r.get(0),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_canary_takes_about_its_share_and_keeps_its_workspaces_as_it_grows() {
        let seeds: Vec<String> = (0..20_000).map(|i| format!("token:a\nkey-{i}")).collect();
        for percent in [1u8, 10, 50, 99] {
            let n = seeds
                .iter()
                .filter(|s| in_share("registry:o/k", "stable", s, percent))
                .count();
            let share = n as f64 / seeds.len() as f64 * 100.0;
            assert!(
                (share - f64::from(percent)).abs() < 1.0,
                "{percent}%: {share}"
            );
        }
        // Every seed in the 10% share is in the 50% one.
        assert!(seeds
            .iter()
            .filter(|s| in_share("registry:o/k", "stable", s, 10))
            .all(|s| in_share("registry:o/k", "stable", s, 50)));
    }

    #[test]
    fn without_a_seed_or_a_canary_the_label_gives_its_own_value() {
        let mut p = Point {
            revision: 3,
            value: "a".into(),
            canary: None,
        };
        assert_eq!(p.pick("set:s", "stable", Some("x")).0, "a");
        p.canary = Some(Canary {
            value: "b".into(),
            percent: 99,
        });
        assert_eq!(p.pick("set:s", "stable", None).0, "a");
        let taken: Vec<bool> = (0..50)
            .map(|i| p.pick("set:s", "stable", Some(&i.to_string())).1.canary)
            .collect();
        assert!(taken.iter().filter(|&&c| c).count() >= 45);
    }

    #[test]
    fn names_are_checked() {
        for ok in ["stable", "canary", "v1.2", "a_b-c", "0"] {
            check_name("label", ok).unwrap();
        }
        for bad in ["", "Stable", "-x", ".x", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_name("label", bad).is_err(), "{bad:?}");
        }
    }
}
