//! `cloud-harness signature …`: signatures over a bundle served in a tier — the text to sign,
//! signing it with an SSH key (`ssh-keygen -Y sign`), adding one made elsewhere, listing,
//! removing, and the trust policy's verdict. Kept in the state database `serve` uses, and
//! beside the bundle in the store of record when `TOOLKIT_STORE_URL` names one.

use super::control::{actor, print, HomeArg};
use clap::{Args, Subcommand};
use cloud_harness_control::signatures::policy::Policy;
use cloud_harness_control::signatures::stored;
use cloud_harness_control::signatures::verdict::judge;
use cloud_harness_control::signatures::{canonical, check_tier, Subject, NAMESPACE};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_provision::index::{BundleIndex, BundleRecord};
use cloud_harness_provision::remote::RemoteStore;
use cloud_harness_store::cas::{Digest, Store};
use serde_json::json;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

#[derive(Debug, Args)]
pub struct Signed {
    /// The bundle's digest (as `workspace_open` and `toolkit list` show it).
    bundle: Digest,
    /// The tier it is signed for: `owner` or `workspace`.
    #[arg(long)]
    tier: String,
    /// The commit, when the bundle is the tree of more than one.
    #[arg(long)]
    commit: Option<String>,
    /// The repository, when the bundle came from more than one.
    #[arg(long)]
    url: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum SignatureCommand {
    /// Print the text a signature of BUNDLE in TIER signs (to sign elsewhere:
    /// `… | ssh-keygen -Y sign -n cloud-harness-bundle -f KEY > SIG`).
    Payload(Signed),
    /// Sign BUNDLE in TIER with an Ed25519 SSH key (by `ssh-keygen -Y sign`) and add the
    /// signature (audited).
    Sign {
        #[command(flatten)]
        what: Signed,
        /// The private key file (`ssh-keygen -t ed25519` made it).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
    },
    /// Add a signature of BUNDLE in TIER made elsewhere (audited); refused unless it signs
    /// exactly that bundle in that tier.
    Add {
        #[command(flatten)]
        what: Signed,
        /// The signature (`-----BEGIN SSH SIGNATURE-----`); `-` reads standard input.
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
    },
    /// Every signature of BUNDLE.
    List { bundle: Digest },
    /// Remove the signature of BUNDLE in TIER by KEY (a fingerprint, `SHA256:…`; audited).
    Remove {
        #[command(flatten)]
        what: Signed,
        #[arg(long)]
        key: String,
    },
    /// The trust policy's verdict on BUNDLE in TIER (`CLOUD_HARNESS_TRUST_POLICY`).
    Check(Signed),
}

pub fn run(store: &Store, home: &HomeArg, cmd: SignatureCommand) -> Result<u8> {
    let record = |what: &Signed| -> Result<(BundleRecord, &'static str)> {
        Ok((record_of(store, what)?, check_tier(&what.tier)?))
    };
    match cmd {
        SignatureCommand::Payload(what) => {
            let (r, tier) = record(&what)?;
            print!("{}", subject(&r, &what.bundle.to_string(), tier).message());
        }
        SignatureCommand::Sign { what, key } => {
            let (r, tier) = record(&what)?;
            let bundle = what.bundle.to_string();
            let on = subject(&r, &bundle, tier);
            let text = ssh_keygen_sign(&key, &on.message())?;
            print(json!(add(&home.db()?, on, &text)?));
        }
        SignatureCommand::Add { what, file } => {
            let (r, tier) = record(&what)?;
            let bundle = what.bundle.to_string();
            let text = read_signature(&file)?;
            print(json!(add(&home.db()?, subject(&r, &bundle, tier), &text)?));
        }
        SignatureCommand::List { bundle } => {
            print(json!(stored::of_bundle(&home.db()?, &bundle.to_string())?));
        }
        SignatureCommand::Remove { what, key } => {
            let tier = check_tier(&what.tier)?;
            let bundle = what.bundle.to_string();
            // With --commit or --url, the signatures of that record only; else every one.
            let record = match what.commit.is_some() || what.url.is_some() {
                true => Some(record_of(store, &what)?),
                false => None,
            };
            let on = record.as_ref().map(|r| subject(r, &bundle, tier));
            let only = on.map(|s| (s.url, s.commit));
            // The database first: its tombstones keep this runner from taking a copy again
            // even if the bucket's cannot be deleted now (the command then fails, saying so).
            let n = stored::remove(&home.db()?, &bundle, tier, &key, only, &actor())?;
            if let Some(remote) = RemoteStore::from_env()? {
                remote.remove_signatures(&what.bundle, on, &key).map_err(|e| {
                    e.context("removed from the state database, but not from the store of record (run it again)")
                })?;
            }
            print(
                json!({ "removed": { "bundle": bundle, "tier": tier, "key": key, "signatures": n } }),
            );
        }
        SignatureCommand::Check(what) => {
            let (r, tier) = record(&what)?;
            let bundle = what.bundle.to_string();
            let on = subject(&r, &bundle, tier);
            let policy = Policy::from_env()?;
            let verdict = judge(&policy, on, &stored::of_subject(&home.db()?, on)?);
            print(
                json!({ "bundle": bundle, "tier": tier, "url": on.url, "commit": on.commit, "verdict": verdict, "served": verdict.served() }),
            );
            return Ok(if verdict.served() { 0 } else { 1 });
        }
    }
    Ok(0)
}

fn subject<'a>(r: &'a BundleRecord, bundle: &'a str, tier: &'static str) -> Subject<'a> {
    Subject {
        url: &r.key.url,
        commit: &r.key.commit,
        bundle,
        tier,
    }
}

/// The record of the bundle `what` names: the one record of it, or the one of the commit
/// and repository given.
fn record_of(store: &Store, what: &Signed) -> Result<BundleRecord> {
    let mut records: Vec<BundleRecord> = BundleIndex::open(store)
        .list()?
        .into_iter()
        .filter(|r| r.bundle == what.bundle)
        .filter(|r| what.commit.as_ref().is_none_or(|c| r.key.commit == *c))
        .filter(|r| {
            what.url
                .as_ref()
                .is_none_or(|u| canonical(&r.key.url) == canonical(u))
        })
        .collect();
    records.sort_by_cached_key(|r| (canonical(&r.key.url), r.key.commit.clone()));
    records.dedup_by(|a, b| {
        canonical(&a.key.url) == canonical(&b.key.url) && a.key.commit == b.key.commit
    });
    match records.len() {
        0 => Err(Error::not_found(format!(
            "{} is not a bundle of this store{} (see `cloud-harness toolkit list`)",
            what.bundle,
            if what.commit.is_some() || what.url.is_some() {
                " at that commit and repository"
            } else {
                ""
            }
        ))),
        1 => Ok(records.remove(0)),
        _ => Err(Error::new(
            Code::InvalidArgument,
            format!(
                "{} is the tree of more than one commit; name one with --commit (and --url): {}",
                what.bundle,
                records
                    .iter()
                    .map(|r| format!("{} at {}", r.key.url, r.key.commit))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// Adds the signature beside the bundle in the store of record, then in the database: an
/// add that fails leaves the database as it was (a copy in the bucket alone is taken only by
/// a runner whose policy trusts its key, which is what the signer meant).
fn add(db: &cloud_harness_control::state::Db, on: Subject, text: &str) -> Result<stored::Stored> {
    let signed = cloud_harness_control::signatures::Signed::parse(text)?;
    if !signed.verifies(&on.message()) {
        // Refused by `stored::add`, with its reason, before the bucket is touched.
        return stored::add(db, on, text, &actor());
    }
    if let Some(remote) = RemoteStore::from_env()? {
        remote.put_signature(on, &signed.fingerprint(), text.trim())?;
    }
    stored::add(db, on, text, &actor())
}

fn read_signature(file: &PathBuf) -> Result<String> {
    let limit = cloud_harness_control::signatures::MAX_TEXT as u64 + 1;
    let mut text = String::new();
    let read = if file.as_os_str() == "-" {
        std::io::stdin().take(limit).read_to_string(&mut text)
    } else {
        std::fs::File::open(file).and_then(|f| f.take(limit).read_to_string(&mut text))
    };
    read.map_err(|e| Error::io(file, e))?;
    Ok(text)
}

/// `message` signed by `ssh-keygen -Y sign` with the key at `key` (it asks for the key's
/// passphrase itself, on the terminal).
fn ssh_keygen_sign(key: &PathBuf, message: &str) -> Result<String> {
    let mut child = Command::new("ssh-keygen")
        .args(["-q", "-Y", "sign", "-n", NAMESPACE, "-f"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| {
            Error::new(
                Code::Internal,
                format!("cannot run ssh-keygen (install openssh-client): {e}"),
            )
        })?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(message.as_bytes())
        .map_err(|e| Error::internal(format!("writing to ssh-keygen: {e}")))?;
    let out = child
        .wait_with_output()
        .map_err(|e| Error::internal(format!("ssh-keygen: {e}")))?;
    if !out.status.success() {
        return Err(Error::new(
            Code::InvalidArgument,
            format!(
                "ssh-keygen could not sign with {} ({})",
                key.display(),
                out.status
            ),
        ));
    }
    String::from_utf8(out.stdout).map_err(|_| Error::internal("ssh-keygen wrote no text"))
}
