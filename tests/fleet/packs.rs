//! A bundle's pack in the store of record: a second runner's start in one request, and a pack
//! that is not what its record says refused as a whole, the start falling back to the
//! bucket's objects one by one.

use super::{acquire, contents, fleet, toolkit, Fleet, PREFIX};
use cloud_harness_provision::index::{BundleRecord, PackRef};
use cloud_harness_provision::staging::Limits;
use cloud_harness_store::cas::{Digest, Store};
use std::fs;

/// Objects of the bundle `record` names (its manifest, trees and blobs), each once.
fn objects_of(store: &Store, record: &BundleRecord) -> usize {
    let mut seen = std::collections::HashSet::new();
    let mut trees = vec![record.bundle];
    seen.insert((true, record.bundle));
    while let Some(t) = trees.pop() {
        for e in store.tree(&t).unwrap().entries() {
            let is_tree = e.kind == cloud_harness_store::cas::Kind::Tree;
            if seen.insert((is_tree, e.digest)) && is_tree {
                trees.push(e.digest);
            }
        }
    }
    seen.len() + 1
}

fn pack_key(pack: &PackRef) -> String {
    let hex = pack.digest.hex();
    format!("{PREFIX}/objects/pack/{}/{}", &hex[..2], &hex[2..])
}

/// A toolkit acquired and published by one runner; its record in the bucket, and the store
/// it was acquired into.
fn published(f: &Fleet) -> (BundleRecord, Store) {
    let (url, commit) = f.repo("team/packed.git", toolkit(10, 3, "packed"));
    let a = f.runner("store-a");
    acquire(&a, &url, &commit).unwrap();
    let record = f.records().pop().unwrap();
    (record, a.store.clone())
}

#[test]
fn a_second_runner_starts_from_the_bundles_pack_in_one_request() {
    let Some(f) = fleet() else { return };
    let (record, a) = published(&f);
    let pack = record.pack.expect("the record names its pack");
    let bytes = fs::read(f.s3.file(&pack_key(&pack))).unwrap();
    assert_eq!(
        (Digest::of(&bytes), bytes.len() as u64),
        (pack.digest, pack.size)
    );
    let n = objects_of(&a, &record);

    let b = Store::open(f.w.tmp.path().join("store-b")).unwrap();
    let moved =
        f.s3.remote(PREFIX)
            .download(&b, &record, Limits::default())
            .unwrap();
    assert_eq!((moved.requests, moved.objects), (1, n), "{moved:?}");
    assert!(b.verify().unwrap().problems.is_empty());
    let tmp = f.w.tmp.path();
    assert_eq!(
        contents(&b, &record.bundle, &tmp.join("out-b")),
        contents(&a, &record.bundle, &tmp.join("out-a"))
    );
    // Object by object, as before packs (and as a runner with packs off does): a request each.
    let c = Store::open(tmp.join("store-c")).unwrap();
    let remote = f.s3.remote(PREFIX).with_packs(false);
    let moved = remote.download(&c, &record, Limits::default()).unwrap();
    assert_eq!((moved.requests, moved.objects), (n, n), "{moved:?}");
}

#[test]
fn a_pack_with_an_object_that_does_not_match_its_digest_is_refused_and_the_start_falls_back() {
    let Some(f) = fleet() else { return };
    let (mut record, a) = published(&f);
    let n = objects_of(&a, &record);
    // Someone who can write to the bucket puts a pack with one byte of its last object
    // changed, at the key its own digest names, and points the record at it: the pack is
    // whole and what its record says, one object in it is not.
    let pack = record.pack.unwrap();
    let mut bytes = fs::read(f.s3.file(&pack_key(&pack))).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x20;
    let forged = PackRef {
        digest: Digest::of(&bytes),
        size: bytes.len() as u64,
    };
    let key = f.s3.file(&pack_key(&forged));
    fs::create_dir_all(key.parent().unwrap()).unwrap();
    fs::write(&key, &bytes).unwrap();
    record.pack = Some(forged);
    let record_key = f.s3.keys(&format!("{PREFIX}/index/bundles")).pop().unwrap();
    fs::write(f.s3.file(&record_key), serde_json::to_vec(&record).unwrap()).unwrap();

    // Refused as a whole: the bundle comes object by object (the pack's request and one for
    // each object), whole and verified.
    let b = Store::open(f.w.tmp.path().join("store-b")).unwrap();
    let moved =
        f.s3.remote(PREFIX)
            .download(&b, &record, Limits::default())
            .unwrap();
    assert_eq!((moved.requests, moved.objects), (n + 1, n), "{moved:?}");
    assert!(b.verify().unwrap().problems.is_empty());
    let tmp = f.w.tmp.path();
    assert_eq!(
        contents(&b, &record.bundle, &tmp.join("out-b")),
        contents(&a, &record.bundle, &tmp.join("out-a"))
    );

    // A pack cut short, or longer than its record says, is refused the same way; and with the
    // bucket's own copy of that object bad too, the start fails, naming it, and nothing of the
    // bundle enters the store.
    fs::write(&key, &bytes[..bytes.len() / 2]).unwrap();
    let c = Store::open(tmp.join("store-c")).unwrap();
    let moved =
        f.s3.remote(PREFIX)
            .download(&c, &record, Limits::default())
            .unwrap();
    assert_eq!(moved.requests, n + 1, "{moved:?}");
    let blobs = f.s3.keys(&format!("{PREFIX}/objects/blob"));
    for blob in &blobs {
        fs::write(f.s3.file(blob), b"not what the name says\n").unwrap();
    }
    let d = Store::open(tmp.join("store-d")).unwrap();
    let err =
        f.s3.remote(PREFIX)
            .download(&d, &record, Limits::default())
            .unwrap_err();
    assert!(err.message.contains("refused"), "{}", err.message);
    assert!(err.details["object"].is_string(), "{}", err.details);
    let left = d.verify().unwrap();
    assert_eq!((left.blobs, left.trees), (0, 0));
}

#[test]
fn a_large_pack_comes_in_ranges_under_way_at_once_and_a_bad_range_is_refused() {
    let Some(f) = fleet() else { return };
    let (record, a) = published(&f);
    let pack = record.pack.unwrap();
    let n = objects_of(&a, &record);
    let tmp = f.w.tmp.path();
    // Ranges of a fifth of the pack (8 MiB by default; this toolkit's pack is small).
    let step = pack.size.div_ceil(5);
    let ranged = || f.s3.remote(PREFIX).with_range_bytes(step);
    let b = Store::open(tmp.join("store-b")).unwrap();
    let moved = ranged().download(&b, &record, Limits::default()).unwrap();
    assert_eq!((moved.requests, moved.objects), (5, n), "{moved:?}");
    assert!(b.verify().unwrap().problems.is_empty());
    assert_eq!(
        contents(&b, &record.bundle, &tmp.join("out-b")),
        contents(&a, &record.bundle, &tmp.join("out-a"))
    );

    // One byte changed in a middle range: the pack is refused whole, the start falls back to
    // the objects one by one (after the pack's five requests).
    let key = f.s3.file(&pack_key(&pack));
    let good = fs::read(&key).unwrap();
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x20;
    fs::write(&key, &bad).unwrap();
    let c = Store::open(tmp.join("store-c")).unwrap();
    let moved = ranged().download(&c, &record, Limits::default()).unwrap();
    assert_eq!((moved.requests, moved.objects), (5 + n, n), "{moved:?}");
    assert!(c.verify().unwrap().problems.is_empty());

    // Longer than its record says (its ranges would all be there): refused the same way.
    let mut longer = good.clone();
    longer.extend_from_slice(b"more\n");
    fs::write(&key, &longer).unwrap();
    let d = Store::open(tmp.join("store-d")).unwrap();
    let moved = ranged().download(&d, &record, Limits::default()).unwrap();
    assert_eq!(moved.objects, n, "{moved:?}");
    assert!(moved.requests > 5, "not refused: {moved:?}");
    assert!(d.verify().unwrap().problems.is_empty());
}

#[test]
fn a_store_that_answers_no_range_gives_the_pack_whole_and_is_asked_whole_from_then_on() {
    let Some(f) = fleet() else { return };
    let (record, a) = published(&f);
    let pack = record.pack.unwrap();
    let n = objects_of(&a, &record);
    let tmp = f.w.tmp.path();
    // A proxy before the store that says 200 where the store answered a range.
    let proxy = crate::support::latency::Latency::without_ranges(std::net::SocketAddr::from((
        [127, 0, 0, 1],
        f.s3.port,
    )));
    let remote =
        f.s3.remote_at(proxy.addr.port(), PREFIX)
            .with_range_bytes(pack.size.div_ceil(5));
    let b = Store::open(tmp.join("store-b")).unwrap();
    let moved = remote.download(&b, &record, Limits::default()).unwrap();
    // The pack whole after the ranges were refused: not object by object.
    assert_eq!(moved.objects, n, "{moved:?}");
    assert!(moved.requests <= 5 + 1, "object by object: {moved:?}");
    assert!(b.verify().unwrap().problems.is_empty());
    assert_eq!(
        contents(&b, &record.bundle, &tmp.join("out-b")),
        contents(&a, &record.bundle, &tmp.join("out-a"))
    );
    // Remembered: the next download asks for it whole at once.
    let c = Store::open(tmp.join("store-c")).unwrap();
    let moved = remote.download(&c, &record, Limits::default()).unwrap();
    assert_eq!((moved.requests, moved.objects), (1, n), "{moved:?}");
}
