//! SHA-256 digests: the names of everything in the store.

use cloud_harness_error::{Error, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::io::{self, Read, Write};
use std::str::FromStr;

/// A SHA-256 digest. Displayed and parsed as `sha256:<64 lowercase hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    pub const PREFIX: &'static str = "sha256:";

    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses either `sha256:<hex>` or bare hex.
    pub fn parse(text: &str) -> Result<Digest> {
        let hex_part = text.strip_prefix(Self::PREFIX).unwrap_or(text);
        let mut out = [0u8; 32];
        if hex_part.len() != 64
            || !hex_part
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            || hex::decode_to_slice(hex_part, &mut out).is_err()
        {
            return Err(Error::invalid(format!(
                "not a digest: {text:?} (want sha256: and 64 lowercase hex digits)"
            )));
        }
        Ok(Digest(out))
    }
}

/// Incremental hashing, for content that arrives in pieces.
#[derive(Default, Clone)]
pub struct Hasher(Sha256);

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> Digest {
        Digest(self.0.finalize().into())
    }
}

impl Digest {
    /// The digest of everything `reader` yields, and its length. Each piece is written on to
    /// `sink` as well (`io::sink()` to hash only), so a copy can be checked as it is made.
    pub fn of_stream(reader: &mut impl Read, sink: &mut impl Write) -> io::Result<(Digest, u64)> {
        let mut hasher = Hasher::default();
        let mut buf = vec![0u8; 256 << 10];
        let mut size = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok((hasher.finish(), size)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            size += n as u64;
            hasher.update(&buf[..n]);
            sink.write_all(&buf[..n])?;
        }
    }
}

impl Digest {
    /// `sha256:<hex>` written into a buffer of its own: listings write thousands of these.
    fn text(&self) -> [u8; 71] {
        let mut out = [0u8; 71];
        out[..7].copy_from_slice(Self::PREFIX.as_bytes());
        hex::encode_to_slice(self.0, &mut out[7..]).expect("64 hex digits fit");
        out
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.text();
        f.write_str(std::str::from_utf8(&text).expect("ASCII"))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = Error;
    fn from_str(s: &str) -> Result<Digest> {
        Digest::parse(s)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text = self.text();
        s.serialize_str(std::str::from_utf8(&text).expect("ASCII"))
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        let text = String::deserialize(d)?;
        Digest::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip() {
        let d = Digest::of(b"abc");
        assert_eq!(
            d.to_string(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(Digest::parse(&d.to_string()).unwrap(), d);
        assert_eq!(Digest::parse(&d.hex()).unwrap(), d);
    }

    #[test]
    fn rejects_malformed_digests() {
        for bad in [
            "",
            "sha256:",
            "sha256:ABC",
            &"g".repeat(64),
            &"A".repeat(64),
        ] {
            assert_eq!(
                Digest::parse(bad).unwrap_err().code,
                cloud_harness_error::Code::InvalidArgument
            );
        }
    }
}
