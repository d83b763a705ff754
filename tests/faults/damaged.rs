//! A restart on damaged state: a state database truncated, with pages overwritten, emptied or
//! gone is refused with its file named (never a silent empty start with a new operator
//! token); the same server starts again from a backup, or afresh once the operator says so.

use super::site::{open, Random, Site};
use super::toolkits::{workspace_of, Toolkits};
use cloud_harness_control::params;
use serde_json::json;
use std::path::Path;

/// A copy of the database while the server runs (`VACUUM INTO`, what `sqlite3 .backup` does).
fn backup(home: &Path, to: &Path) {
    let db = cloud_harness_control::state::Db::open_sqlite(home).unwrap();
    let target = to.display().to_string();
    db.with(|c| c.execute("VACUUM INTO $1", params![target]))
        .unwrap();
}

#[test]
fn a_damaged_state_database_is_refused_by_name_and_a_backup_restores_it() {
    let kits = Toolkits::new();
    let mut site = Site::new(&kits.env("none"), Random::unprinted());
    let running = site.serve();
    let request = json!({"idempotencyKey": "kept", "toolkits": [kits.commit(0)]});
    let kept = workspace_of(&open(&running, &request).unwrap());
    let saved = site.root.path().join("state.backup");
    backup(&site.home(), &saved);
    site.stop(running);
    let db = site.home().join("state.db");

    type Damage = fn(&Path);
    let damages: [(&str, Damage, &str); 4] = [
        (
            "truncated",
            |db| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(db)
                    .unwrap()
                    .set_len(2048)
                    .unwrap()
            },
            "is empty",
        ),
        (
            "pages overwritten",
            |db| {
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new().write(true).open(db).unwrap();
                f.write_all_at(&[0xa5; 8192], 3 * 4096).unwrap();
            },
            "is damaged",
        ),
        ("emptied", |db| std::fs::write(db, b"").unwrap(), "is empty"),
        ("gone", |db| std::fs::remove_file(db).unwrap(), "is empty"),
    ];
    for (what, damage, said) in damages {
        let wal = db.with_extension("db-wal");
        std::fs::copy(&saved, &db).unwrap();
        let _ = std::fs::remove_file(&wal);
        let _ = std::fs::remove_file(db.with_extension("db-shm"));
        damage(&db);
        let log = match site.start(None) {
            Err(log) => log,
            Ok(mut running) => {
                let _ = running.child.kill();
                panic!(
                    "{what}: a damaged state database was served: {}",
                    running.log.lock().unwrap()
                );
            }
        };
        // Named, and said what it is (damaged or empty: SQLite tells a truncated file
        // either way, by how much of its first page is left).
        let named = log.contains(&db.display().to_string());
        let told = ["is empty", "is damaged", "malformed"]
            .iter()
            .any(|t| log.contains(t));
        assert!(
            named && told && (log.contains(said) || what == "truncated"),
            "{what}: {log}"
        );
        // Nothing was made in its place: no tables written into an emptied file.
        if matches!(what, "emptied" | "gone") {
            let conn = rusqlite::Connection::open(&db).unwrap();
            let tables: i64 = conn
                .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
                .unwrap();
            assert_eq!(tables, 0, "{what}");
        }
    }

    // Restored from the backup: the workspace is served again.
    std::fs::copy(&saved, &db).unwrap();
    let running = site.serve();
    // The same key gives the same workspace, served again.
    let again = workspace_of(&open(&running, &request).unwrap());
    assert_eq!(again, kept);
    site.stop(running);

    // Afresh, on purpose: the database emptied and the home told so.
    std::fs::write(&db, b"").unwrap();
    std::fs::remove_file(site.home().join("state-database")).unwrap();
    let running = site.serve();
    site.stop(running);
}
