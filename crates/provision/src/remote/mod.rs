//! The store of record on object storage (`TOOLKIT_STORE_URL=s3://bucket/prefix`): every
//! runner of a fleet publishes what it acquires there, and a runner that misses a bundle in its
//! own store finds it there before it asks a git server. The local store stays the cache.
//!
//! ```text
//! <prefix>/objects/blob/ab/cdef…     blobs, named by their SHA-256, as in the local store
//! <prefix>/objects/tree/ab/cdef…     canonical trees
//! <prefix>/objects/pack/ab/cdef…     a bundle's objects in one (`pack`), named by the record
//! <prefix>/index/bundles/<key>.json  bundle-index records, written after all they name
//! <prefix>/index/tags/<id>.json      tags resolved to commits
//! ```
//!
//! Objects are immutable and named by digest, so every put is create-only (`If-None-Match: *`)
//! and "already there" is success, the retry of one's own first attempt included. Publication
//! goes leaves first — blobs, trees from the deepest up, the manifest — and the index record
//! last, so a record found names only objects that are there.
//!
//! What the bucket holds is not trusted: anyone who can write to it could have put anything
//! there. A record is read only up to [`MAX_RECORD`] bytes and must name the key it was found
//! by; a download holds a bundle to the ceilings a toolkit fetched from git is held to (its
//! objects, bytes, file sizes and depth: `CLOUD_HARNESS_MAX_*`), checks every object's bytes
//! against its name and every blob's length against what its tree says, reads no object
//! larger than it may be, counts the bundle's files, folders and bytes by path as staging
//! would, and only then enters the whole bundle in one batch; the local bundle index learns of
//! the bundle after that. A refusal names the record or the object. A download ends within the
//! fetch timeout (`CLOUD_HARNESS_FETCH_TIMEOUT`), two run at once in the process, and at most
//! 64 MiB of objects are on their way in at once.

mod ceilings;
mod download;
pub mod gc;
pub mod pack;
mod publish;
mod signatures;
mod start;

use super::index::{self, BundleKey, BundleRecord};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::{Digest, ObjectKind};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig,
};
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Requests under way at once for one bundle: enough to hide a round trip of latency
/// without flooding a small server.
const AT_ONCE: usize = 64;

/// The settings this module reads.
pub(crate) const URL_VAR: &str = "TOOLKIT_STORE_URL";
const PACKS_VAR: &str = "TOOLKIT_STORE_PACKS";

pub use super::index::MAX_RECORD;
/// The largest tag record read.
const MAX_TAG_RECORD: u64 = 64 << 10;

#[derive(Clone)]
pub struct RemoteStore {
    objects: Arc<dyn ObjectStore>,
    prefix: String,
    url: String,
    /// Whether bundles are published with a pack and downloaded from one
    /// (`TOOLKIT_STORE_PACKS`, on unless `false`).
    packs: bool,
    /// A pack larger than this comes in ranges of this size, several at once.
    range_bytes: u64,
    /// Set once the store (or a proxy before it) answered a range with something else: its
    /// packs come whole from then on.
    no_ranges: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStore")
            .field("url", &self.url)
            .finish()
    }
}

/// What a download or a publication moved.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// Objects sent or received.
    pub objects: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Objects already on the other side.
    pub present: usize,
    /// GET requests a download made for objects (a pack is one, or one per range).
    pub requests: usize,
}

/// One runtime for every request to object storage, whatever thread asks (acquisitions run on
/// blocking threads of the server's runtime, or on the CLI's main thread).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            // Hashing, decoding and reading the local store for downloads.
            .max_blocking_threads(2)
            .thread_name("object-store")
            .enable_all()
            .build()
            .inspect(|made| cloud_harness_memory::idle::answered_by(made.handle()))
            .expect("a runtime for object storage")
    })
}

/// Runs `future` on the object-storage runtime and waits for it. A future that panicked is
/// an INTERNAL error of its own, not a panic of the caller.
fn wait<T: Send + 'static>(future: impl Future<Output = Result<T>> + Send + 'static) -> Result<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(future.await);
    });
    rx.recv().unwrap_or_else(|_| {
        Err(Error::internal(
            "a request to object storage failed unexpectedly (its task panicked; see the log)",
        ))
    })
}

/// Runs `work` on a blocking thread of the object-storage runtime (hashing, decoding, the
/// local store), not on one of its two workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(Error::internal(format!(
            "a blocking step of a download failed: {e}"
        )))
    })
}

/// A record of the store of record that is not used: too large, or not a record.
fn bad_record(url: &str, path: &ObjectPath, code: Code, why: &str) -> Error {
    cloud_harness_control::metrics::remote("refused");
    Error::new(
        code,
        format!("object storage {url} has a bad record {path} ({why}); it was refused"),
    )
    .with_details(serde_json::json!({ "store": url, "record": path.as_ref() }))
}

/// An object of the store of record that may not enter the local store.
fn refused(url: &str, kind: ObjectKind, digest: &Digest, why: &str) -> Error {
    cloud_harness_control::metrics::remote("refused");
    Error::new(
        Code::Upstream,
        format!(
            "object storage {url} has a bad {} {digest} ({why}); it was refused and nothing of its bundle entered the store",
            kind.dir_name()
        ),
    )
    .with_details(serde_json::json!({
        "store": url,
        "object": digest.to_string(),
        "kind": kind.dir_name(),
    }))
}

fn unreachable(url: &str, e: object_store::Error) -> Error {
    Error::new(Code::Upstream, format!("object storage {url} failed: {e}"))
        .with_details(serde_json::json!({ "store": url, "retryable": true }))
}

impl RemoteStore {
    /// The store of record `TOOLKIT_STORE_URL` names, if any, with the usual AWS settings
    /// (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_ALLOW_HTTP` for a server on loopback) from the environment.
    pub fn from_env() -> Result<Option<RemoteStore>> {
        match std::env::var(URL_VAR) {
            Ok(url) if !url.is_empty() => {
                // Every `AWS_*` variable object storage knows, as `AmazonS3Builder::from_env`
                // reads them, over this module's defaults.
                let mut builder = defaults();
                for (key, value) in std::env::vars() {
                    if let Some(key) = key
                        .strip_prefix("AWS_")
                        .and_then(|_| key.to_ascii_lowercase().parse().ok())
                    {
                        builder = builder.with_config(key, value);
                    }
                }
                let packs = match std::env::var(PACKS_VAR).as_deref() {
                    Ok("false") => false,
                    Ok("true") | Ok("") | Err(_) => true,
                    Ok(other) => {
                        return Err(Error::field(
                            Code::InvalidArgument,
                            PACKS_VAR,
                            format!("{PACKS_VAR} is true or false, not {other}"),
                        ))
                    }
                };
                RemoteStore::build(&url, builder).map(|r| Some(r.with_packs(packs)))
            }
            _ => Ok(None),
        }
    }

    /// The store of record at `url` with these settings, named as their `AWS_*` variables
    /// are (`("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")`), and nothing from the
    /// environment.
    pub fn open(url: &str, settings: &[(&str, &str)]) -> Result<RemoteStore> {
        let mut builder = defaults();
        for (key, value) in settings {
            let key = key
                .to_ascii_lowercase()
                .parse()
                .map_err(|_| Error::invalid(format!("{key} is not a setting of object storage")))?;
            builder = builder.with_config(key, *value);
        }
        RemoteStore::build(url, builder)
    }

    fn build(url: &str, builder: AmazonS3Builder) -> Result<RemoteStore> {
        let bad = |why: &str| {
            Error::invalid(format!("{URL_VAR}={url}: {why}"))
                .with_details(serde_json::json!({ "setting": URL_VAR }))
        };
        let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        if parsed.scheme() != "s3" {
            return Err(bad("only s3://bucket/prefix is supported"));
        }
        let bucket = parsed
            .host_str()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| bad("no bucket"))?;
        let prefix = parsed.path().trim_matches('/').to_owned();
        // As typed: the URL parser would quietly resolve `a/../b` to `b`.
        if url.split('/').skip(3).any(|p| p == "." || p == "..") {
            return Err(bad("the prefix may not hold . or .."));
        }
        // Throttling and 5xx answers are retried with backoff, but briefly: an open waiting
        // on an outage of object storage falls back to git or to the local store instead.
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: 4,
            retry_timeout: Duration::from_secs(10),
        };
        let objects = builder
            .with_bucket_name(bucket)
            .with_retry(retry)
            .build()
            .map_err(|e| bad(&e.to_string()))?;
        Ok(RemoteStore {
            objects: Arc::new(objects),
            prefix,
            url: url.to_owned(),
            packs: true,
            range_bytes: pack::RANGE_BYTES,
            no_ranges: Arc::default(),
        })
    }

    /// With `false`, bundles are published and downloaded object by object only.
    pub fn with_packs(mut self, packs: bool) -> RemoteStore {
        self.packs = packs;
        self
    }

    /// Packs larger than `bytes` come in ranges of `bytes`, [`pack::RANGES_AT_ONCE`] at once
    /// (8 MiB by default); `u64::MAX` fetches every pack in one request.
    pub fn with_range_bytes(mut self, bytes: u64) -> RemoteStore {
        self.range_bytes = bytes.max(1);
        self
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn path(&self, rest: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(rest)
        } else {
            ObjectPath::from(format!("{}/{rest}", self.prefix))
        }
    }

    fn object_path(&self, kind: ObjectKind, digest: &Digest) -> ObjectPath {
        let hex = digest.hex();
        self.path(&format!(
            "objects/{}/{}/{}",
            kind.dir_name(),
            &hex[..2],
            &hex[2..]
        ))
    }

    fn record_path(&self, key: &BundleKey) -> ObjectPath {
        self.path(&format!("index/bundles/{}.json", key.id()))
    }

    fn tag_path(&self, url: &str, tag: &str) -> ObjectPath {
        self.path(&format!("index/tags/{}.json", index::tag_id(url, tag)))
    }

    /// The bytes at `path` (at most `max`, else a refusal naming it), or None when there is
    /// nothing there.
    fn get(&self, path: ObjectPath, max: u64) -> Result<Option<Vec<u8>>> {
        let objects = self.objects.clone();
        let url = self.url.clone();
        wait(async move {
            match get(&objects, &path, max).await {
                Ok(Got::Bytes(bytes)) => Ok(Some(bytes)),
                Ok(Got::Missing) => Ok(None),
                Ok(Got::TooLarge(size)) => Err(bad_record(
                    &url,
                    &path,
                    Code::TooLarge,
                    &format!("{size} bytes or more, more than the {max} a record may have"),
                )),
                Err(e) => Err(unreachable(&url, e)),
            }
        })
    }

    /// The record of `key` in the store of record, if one was published. One that is too
    /// large or is not a record is refused, named.
    pub fn record(&self, key: &BundleKey) -> Result<Option<BundleRecord>> {
        let path = self.record_path(key);
        let Some(bytes) = self.get(path.clone(), MAX_RECORD)? else {
            return Ok(None);
        };
        let record = BundleRecord::decode(&bytes).map_err(|e| {
            bad_record(
                &self.url,
                &path,
                Code::Upstream,
                &format!("of {}: {}", key.url, e.message),
            )
        })?;
        // A record is found by a digest of its key; one naming another key is not this one.
        Ok((record.key == *key).then_some(record))
    }

    /// The commit a tag was resolved to by any runner, if one was published.
    pub fn tag(&self, url: &str, tag: &str) -> Result<Option<String>> {
        Ok(self
            .get(self.tag_path(url, tag), MAX_TAG_RECORD)?
            .and_then(|bytes| index::commit_of_tag(&bytes, url, tag)))
    }

    /// Records a resolved tag (create-only: the first runner's resolution stands).
    pub(crate) fn put_tag(&self, url: &str, tag: &str, commit: &str) -> Result<()> {
        let json = index::tag_record(url, tag, commit);
        let path = self.tag_path(url, tag);
        let objects = self.objects.clone();
        let remote = self.url.clone();
        wait(async move {
            put_new(&objects, &path, json)
                .await
                .map_err(|e| unreachable(&remote, e))
        })
        .map(|_| ())
    }
}

/// Timeouts short enough that an outage is noticed quickly; settings given override them.
fn defaults() -> AmazonS3Builder {
    AmazonS3Builder::new()
        .with_config(
            AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
            "2s",
        )
        .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "60s")
}

/// What a bounded read of one object found.
enum Got {
    Missing,
    /// At least this many bytes, more than allowed: not read (or not read on).
    TooLarge(u64),
    Bytes(Vec<u8>),
}

/// The object at `path`, read only if it is at most `max` bytes: the size the server gives
/// is checked before the body is read, and the body as it comes (a server may say less).
async fn get(
    objects: &Arc<dyn ObjectStore>,
    path: &ObjectPath,
    max: u64,
) -> object_store::Result<Got> {
    get_held(objects, path, max, false)
        .await
        .map(|(got, _)| got)
}

/// Bytes of objects on their way in (asked for, arriving, being verified) at once, all
/// downloads together.
const IN_FLIGHT_BYTES: u64 = 64 << 20;
static IN_FLIGHT: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(IN_FLIGHT_BYTES as usize);

/// A share of the bytes in flight for an object of `size` bytes (all of them, for a larger
/// one), waited for.
async fn hold(size: u64) -> object_store::Result<tokio::sync::SemaphorePermit<'static>> {
    IN_FLIGHT
        .acquire_many(size.min(IN_FLIGHT_BYTES) as u32)
        .await
        .map_err(|e| object_store::Error::Generic {
            store: "in-flight bytes",
            source: Box::new(e),
        })
}

/// [`get`], and with `held`, a share of the bytes in flight ([`hold`]) taken once the server
/// says the size and before the body is read, kept by the caller until it is done with the
/// bytes. The buffer grows as bytes arrive, never past `max`: what the server says is no
/// reason to allocate.
async fn get_held(
    objects: &Arc<dyn ObjectStore>,
    path: &ObjectPath,
    max: u64,
    held: bool,
) -> object_store::Result<(Got, Option<tokio::sync::SemaphorePermit<'static>>)> {
    use futures_util::StreamExt;
    let result = match objects.get(path).await {
        Ok(result) => result,
        Err(object_store::Error::NotFound { .. }) => return Ok((Got::Missing, None)),
        Err(e) => return Err(e),
    };
    let said = result.meta.size;
    if said > max {
        return Ok((Got::TooLarge(said), None));
    }
    let permit = match held {
        true => Some(hold(said).await?),
        false => None,
    };
    let mut bytes: Vec<u8> = Vec::new();
    let mut body = result.into_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        let len = bytes.len() + chunk.len();
        if len as u64 > max {
            return Ok((Got::TooLarge(len as u64), None));
        }
        if len > bytes.capacity() {
            let grown = len.max(bytes.capacity() * 2).min(max as usize);
            bytes.reserve_exact(grown - bytes.len());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok((Got::Bytes(bytes), permit))
}

/// A create-only put: true when this call created the object, false when it was there.
async fn put_new(
    objects: &Arc<dyn ObjectStore>,
    path: &ObjectPath,
    bytes: Vec<u8>,
) -> object_store::Result<bool> {
    let options = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    match objects
        .put_opts(path, PutPayload::from(bytes), options)
        .await
    {
        Ok(_) => Ok(true),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
        // Some servers answer a failed `If-None-Match: *` as a failed precondition.
        Err(object_store::Error::Precondition { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(url: &str) -> String {
        RemoteStore::open(url, &[]).unwrap_err().message
    }

    #[test]
    fn only_an_s3_url_with_a_bucket_and_a_plain_prefix_is_taken() {
        assert!(refusal("https://bucket/prefix").contains("only s3://bucket/prefix"));
        assert!(refusal("s3:///prefix").contains("no bucket"));
        assert!(refusal("s3://bucket/a/../b").contains(". or .."));
        assert!(refusal("not a url").contains(URL_VAR));
        let store =
            RemoteStore::open("s3://bucket/team/skills/", &[("AWS_REGION", "eu-west-1")]).unwrap();
        let digest = Digest::of(b"x");
        let hex = digest.hex();
        assert_eq!(
            store.object_path(ObjectKind::Blob, &digest).as_ref(),
            format!("team/skills/objects/blob/{}/{}", &hex[..2], &hex[2..])
        );
    }

    #[test]
    fn a_request_that_panics_is_an_internal_error_not_a_panic_of_its_caller() {
        let e = wait(async {
            if true {
                panic!("a bug in a request to object storage");
            }
            Ok(())
        })
        .unwrap_err();
        assert_eq!(e.code, Code::Internal, "{e}");
        assert!(e.message.contains("panicked"), "{e}");
        // The runtime goes on answering.
        assert_eq!(wait(async { Ok(7) }).unwrap(), 7);
    }

    #[test]
    fn an_unknown_setting_is_named() {
        let e = RemoteStore::open("s3://bucket", &[("AWS_NO_SUCH_THING", "1")]).unwrap_err();
        assert!(e.message.contains("AWS_NO_SUCH_THING"), "{}", e.message);
    }
}
