//! The canonical tree encoding, version 1.
//!
//! ```text
//! cloud-harness tree 1\n
//! <kind> <size> <64 hex digest> <name>\0      one line per entry, in canonical order
//! ```
//!
//! `kind` is `f` (regular file), `x` (executable file), `l` (symlink, the blob holds the
//! target) or `d` (directory, the digest names another tree; size 0). Entries sort by name
//! bytes with a directory compared as `name/`, git's rule, so the order never depends on the
//! order a file system listed them in. Timestamps, owners and other mode bits are not recorded.
//! Parsing accepts only the canonical form: one tree has exactly one encoding and one digest.

use super::digest::Digest;
use cloud_harness_error::{Error, Result};
use serde::Serialize;
use std::cmp::Ordering;

const HEADER: &[u8] = b"cloud-harness tree 1\n";

/// The most entries one tree may have: a folder of more is refused when a tree is made, and a
/// tree object claiming more (from object storage, say) when it is read. Far beyond any skill
/// folder, and it bounds what one tree costs to decode.
pub const MAX_ENTRIES: usize = 1 << 16;
/// The longest encoding of a tree: [`MAX_ENTRIES`] entries of the longest line (a kind, a
/// 20-digit size, a digest, a 255-byte name, three spaces and a NUL: 344 bytes).
pub const MAX_BYTES: u64 = HEADER.len() as u64 + MAX_ENTRIES as u64 * 344;

/// How deep trees in the store may nest. Every producer holds its trees to it (an import, a
/// staged toolkit), so the walks over stored trees (discovery, links, listings) stay shallow
/// whatever a source held.
pub const MAX_DEPTH: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    Executable,
    Symlink,
    Tree,
}

impl Kind {
    fn tag(self) -> u8 {
        match self {
            Kind::File => b'f',
            Kind::Executable => b'x',
            Kind::Symlink => b'l',
            Kind::Tree => b'd',
        }
    }

    fn from_tag(tag: u8) -> Option<Kind> {
        Some(match tag {
            b'f' => Kind::File,
            b'x' => Kind::Executable,
            b'l' => Kind::Symlink,
            b'd' => Kind::Tree,
            _ => return None,
        })
    }

    /// Whether the digest names a blob (as opposed to a tree).
    pub fn is_blob(self) -> bool {
        self != Kind::Tree
    }

    /// The permission bits a materialized or mounted entry gets.
    pub fn mode(self) -> u32 {
        match self {
            Kind::File => 0o644,
            Kind::Executable | Kind::Tree => 0o755,
            Kind::Symlink => 0o777,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Entry {
    pub name: String,
    pub kind: Kind,
    /// Bytes of the blob; 0 for a tree.
    pub size: u64,
    pub digest: Digest,
}

/// A parsed tree: entries in canonical order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tree {
    entries: Vec<Entry>,
}

/// Git's order: compare names as bytes, a directory as if it ended with `/`.
pub fn canonical_order(a_name: &str, a_kind: Kind, b_name: &str, b_kind: Kind) -> Ordering {
    let a = a_name.bytes().chain((a_kind == Kind::Tree).then_some(b'/'));
    let b = b_name.bytes().chain((b_kind == Kind::Tree).then_some(b'/'));
    a.cmp(b)
}

fn too_many() -> Error {
    Error::too_large(format!(
        "a folder holds more than the limit of {MAX_ENTRIES} entries"
    ))
    .with_details(serde_json::json!({ "limit": MAX_ENTRIES }))
}

/// A name that may stand in a tree: one path component, UTF-8, not `.` or `..`.
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(Error::invalid(format!("invalid entry name {name:?}")));
    }
    if name.len() > 255 {
        return Err(Error::invalid(format!(
            "entry name longer than 255 bytes: {name:?}"
        )));
    }
    Ok(())
}

impl Tree {
    /// Builds a tree from entries in any order. Duplicate or invalid names, and more than
    /// [`MAX_ENTRIES`] entries, are errors.
    pub fn new(mut entries: Vec<Entry>) -> Result<Tree> {
        if entries.len() > MAX_ENTRIES {
            return Err(too_many());
        }
        for e in &entries {
            check_name(&e.name)?;
        }
        entries.sort_by(|a, b| canonical_order(&a.name, a.kind, &b.name, b.kind));
        // Names are unique regardless of kind: `a` and `a/` cannot both exist on a disk.
        let mut names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(format!("duplicate entry name {:?}", w[0])));
        }
        Ok(Tree { entries })
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn into_entries(self) -> Vec<Entry> {
        self.entries
    }

    pub fn get(&self, name: &str) -> Option<&Entry> {
        if name.contains('/') {
            return None;
        }
        // A directory sorts as `name/`, anything else as `name`: search for both keys.
        [Kind::File, Kind::Tree].into_iter().find_map(|kind| {
            self.entries
                .binary_search_by(|e| canonical_order(&e.name, e.kind, name, kind))
                .ok()
                .map(|i| &self.entries[i])
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER.len() + self.entries.len() * 100);
        out.extend_from_slice(HEADER);
        for e in &self.entries {
            out.push(e.kind.tag());
            out.push(b' ');
            out.extend_from_slice(e.size.to_string().as_bytes());
            out.push(b' ');
            out.extend_from_slice(e.digest.hex().as_bytes());
            out.push(b' ');
            out.extend_from_slice(e.name.as_bytes());
            out.push(0);
        }
        out
    }

    pub fn digest(&self) -> Digest {
        Digest::of(&self.encode())
    }

    /// Parses the canonical encoding; anything else (wrong order, duplicates, leading zeros,
    /// bad names) is an error, so a tree's digest is unique.
    pub fn decode(bytes: &[u8]) -> Result<Tree> {
        let bad = |why: &str| Error::invalid(format!("malformed tree object: {why}"));
        let mut rest = bytes
            .strip_prefix(HEADER)
            .ok_or_else(|| bad("missing header"))?;
        let mut entries = Vec::new();
        while !rest.is_empty() {
            if entries.len() == MAX_ENTRIES {
                return Err(too_many());
            }
            let end = rest
                .iter()
                .position(|&b| b == 0)
                .ok_or_else(|| bad("unterminated entry"))?;
            let line = &rest[..end];
            rest = &rest[end + 1..];
            let mut parts = line.splitn(4, |&b| b == b' ');
            let (Some(tag), Some(size), Some(hex), Some(name)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(bad("entry with missing fields"));
            };
            let kind = match tag {
                [t] => Kind::from_tag(*t),
                _ => None,
            }
            .ok_or_else(|| bad("unknown entry kind"))?;
            let size_text = std::str::from_utf8(size).map_err(|_| bad("size"))?;
            if size_text.is_empty()
                || (size_text.len() > 1 && size_text.starts_with('0'))
                || !size_text.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(bad("non-canonical size"));
            }
            let size: u64 = size_text.parse().map_err(|_| bad("size"))?;
            if kind == Kind::Tree && size != 0 {
                return Err(bad("directory with a size"));
            }
            // Bare hex only: `sha256:<hex>` names the same object in other places, but one
            // tree has one encoding.
            if hex.len() != 64 {
                return Err(bad("non-canonical digest"));
            }
            let digest = Digest::parse(std::str::from_utf8(hex).map_err(|_| bad("digest"))?)?;
            let name = std::str::from_utf8(name)
                .map_err(|_| bad("name is not UTF-8"))?
                .to_owned();
            check_name(&name)?;
            entries.push(Entry {
                name,
                kind,
                size,
                digest,
            });
        }
        // Canonical: in order (`Tree::new` then refuses a name given twice).
        for pair in entries.windows(2) {
            if canonical_order(&pair[0].name, pair[0].kind, &pair[1].name, pair[1].kind)
                == Ordering::Greater
            {
                return Err(bad("entries out of canonical order"));
            }
        }
        Tree::new(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, kind: Kind) -> Entry {
        Entry {
            name: name.into(),
            kind,
            size: if kind == Kind::Tree { 0 } else { 3 },
            digest: Digest::of(name.as_bytes()),
        }
    }

    #[test]
    fn directories_sort_as_if_they_ended_with_a_slash() {
        // "a.md" (0x2e) sorts before "a/" (0x2f), and "a/" before "a0" (0x30).
        let t = Tree::new(vec![
            entry("a0", Kind::File),
            entry("a", Kind::Tree),
            entry("a.md", Kind::File),
        ])
        .unwrap();
        let names: Vec<_> = t.entries().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["a.md", "a", "a0"]);
        for name in ["a.md", "a", "a0"] {
            assert_eq!(t.get(name).unwrap().name, name);
        }
        assert!(t.get("a/").is_none() && t.get("b").is_none());
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/tree_decode.rs`): the decoder took a digest with
    /// its `sha256:` prefix, so two encodings (two digests) named one tree.
    #[test]
    fn a_digest_with_its_prefix_is_not_canonical() {
        let t = Tree::new(vec![entry("a", Kind::File)]).unwrap();
        let canonical = t.encode();
        assert_eq!(Tree::decode(&canonical).unwrap(), t);
        let hex = t.entries()[0].digest.hex();
        let text = String::from_utf8(canonical).unwrap();
        let prefixed = text.replace(&hex, &format!("sha256:{hex}"));
        let err = Tree::decode(prefixed.as_bytes()).unwrap_err();
        assert!(err.message.contains("non-canonical digest"), "{err}");
    }

    #[test]
    fn encoding_round_trips_and_is_order_independent() {
        let a = Tree::new(vec![
            entry("x", Kind::Executable),
            entry("b", Kind::Symlink),
        ])
        .unwrap();
        let b = Tree::new(vec![
            entry("b", Kind::Symlink),
            entry("x", Kind::Executable),
        ])
        .unwrap();
        assert_eq!(a.encode(), b.encode());
        assert_eq!(Tree::decode(&a.encode()).unwrap(), a);
    }

    #[test]
    fn a_tree_has_at_most_max_entries() {
        let entries = |n: usize| -> Vec<Entry> {
            (0..n)
                .map(|i| entry(&format!("f{i:06}"), Kind::File))
                .collect()
        };
        let full = Tree::new(entries(MAX_ENTRIES)).unwrap();
        assert_eq!(Tree::decode(&full.encode()).unwrap(), full);
        let err = Tree::new(entries(MAX_ENTRIES + 1)).unwrap_err();
        assert_eq!(err.code, cloud_harness_error::Code::TooLarge, "{err}");
        // An encoding of one entry more is refused as it is read, before the rest is.
        let mut over = full.encode();
        let extra = Tree::new(vec![entry("zzz", Kind::File)]).unwrap().encode();
        over.extend_from_slice(&extra[HEADER.len()..]);
        let err = Tree::decode(&over).unwrap_err();
        assert_eq!(err.code, cloud_harness_error::Code::TooLarge, "{err}");
        assert_eq!(err.details["limit"], MAX_ENTRIES);
    }

    #[test]
    fn rejects_non_canonical_encodings() {
        let t = Tree::new(vec![entry("a", Kind::File), entry("b", Kind::File)]).unwrap();
        let good = t.encode();
        let swapped = {
            let text = String::from_utf8(good.clone()).unwrap();
            let mut lines: Vec<&str> = text
                .strip_prefix("cloud-harness tree 1\n")
                .unwrap()
                .split_terminator('\0')
                .collect();
            lines.swap(0, 1);
            let mut out = b"cloud-harness tree 1\n".to_vec();
            for l in lines {
                out.extend_from_slice(l.as_bytes());
                out.push(0);
            }
            out
        };
        assert!(Tree::decode(&swapped).is_err());
        let mut padded = good.clone();
        let pos = padded.iter().position(|&b| b == b' ').unwrap();
        padded.insert(pos + 1, b'0');
        assert!(Tree::decode(&padded).is_err());
        assert!(Tree::decode(b"junk").is_err());
        assert!(Tree::new(vec![entry("a", Kind::File), entry("a", Kind::Tree)]).is_err());
        assert!(Tree::new(vec![entry("..", Kind::File)]).is_err());
    }
}
