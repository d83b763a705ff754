//! `skills_read`: a page of a skill's file as the mount serves it, read from the store
//! without a trip through the kernel.

use super::served::Workspace;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_skills::namespace::Reach;
use cloud_harness_skills::relpath;
use cloud_harness_skills::skill::SKILL_MD;
use cloud_harness_skills::spec::Problem;
use nix::errno::Errno;
use serde::Serialize;
use serde_json::json;

/// One page of a file.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Page {
    pub skill: String,
    pub path: String,
    /// The file inside the executor, when the skills are mounted there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub executor_path: Option<String>,
    pub size: u64,
    pub offset: u64,
    pub length: u64,
    /// `utf-8` or `base64`.
    pub encoding: &'static str,
    pub content: String,
    pub eof: bool,
    /// The offset of the next page, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// With a skill's `SKILL.md`: what it breaks of the Agent Skills specification.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<Problem>,
}

/// The longest path inside a skill (`path`, `script`).
pub const MAX_SKILL_PATH: usize = 4096;

/// A file inside a skill, given in `field`: relative, inside the skill folder, naming a file.
pub fn check_skill_path<'a>(path: &'a str, field: &str) -> Result<Vec<&'a str>> {
    cloud_harness_control::input::max_len(field, path, MAX_SKILL_PATH)?;
    let parts = relpath::segments(path, field, "the skill folder")?;
    if parts.is_empty() {
        return Err(Error::field(
            Code::InvalidArgument,
            field,
            format!("{path:?} names no file"),
        ));
    }
    Ok(parts)
}

/// A page as text when it is UTF-8, else base64. A text page whose end splits a character
/// ends before that character (the next page starts with it), so a model never gets an
/// unreadable page of a text file; only a file that is not UTF-8 text comes as base64.
/// Returns the encoding, the content and how many bytes of the file it holds.
fn page_text(mut bytes: Vec<u8>, last: bool) -> (&'static str, String, u64) {
    match std::str::from_utf8(&bytes) {
        Ok(_) => {}
        // Only a character cut by the page's end, in a page with text before it.
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 && !last => {
            bytes.truncate(e.valid_up_to())
        }
        Err(_) => {
            use base64::Engine;
            let text = base64::engine::general_purpose::STANDARD.encode(&bytes);
            return ("base64", text, bytes.len() as u64);
        }
    }
    let length = bytes.len() as u64;
    (
        "utf-8",
        String::from_utf8(bytes).expect("checked above"),
        length,
    )
}

impl Workspace {
    /// Reads a page of a served skill's file.
    pub fn read(&self, skill: &str, path: &str, offset: u64, length: u64) -> Result<Page> {
        let read = self.read_reaching(skill, path, offset, length, Reach::Store)?;
        Ok(read.expect("a read that may use the store always ends"))
    }

    /// [`Workspace::read`] within `reach`: with [`Reach::Held`], `Ok(None)` having read nothing
    /// from the store when the namespace does not hold all the read needs (a file not read
    /// lately), for a thread that must not wait on a disk.
    pub fn read_reaching(
        &self,
        skill: &str,
        path: &str,
        offset: u64,
        length: u64,
        reach: Reach,
    ) -> Result<Option<Page>> {
        let parts = check_skill_path(path, "path")?;
        let problems = match parts.as_slice() {
            [SKILL_MD] => self.problems(skill)?,
            _ => {
                self.skill(skill)?;
                Vec::new()
            }
        };
        let missing = || {
            Error::not_found(format!("skill {skill} has no file {path:?}"))
                .with_details(json!({ "field": "path" }))
        };
        let full: Vec<&str> = std::iter::once(skill)
            .chain(parts.iter().copied())
            .collect();
        let want = length.min(u32::MAX as u64) as u32;
        let (size, bytes) = match self.merged.read_path_reaching(&full, offset, want, reach) {
            Ok(Some(found)) => found,
            Ok(None) => return Err(missing()),
            Err(Errno::EWOULDBLOCK) => return Ok(None),
            Err(Errno::EISDIR) => {
                return Err(Error::field(
                    Code::InvalidArgument,
                    "path",
                    format!("{path:?} is a folder"),
                ))
            }
            Err(Errno::ELOOP) => {
                return Err(Error::field(
                    Code::InvalidArgument,
                    "path",
                    format!("{path:?} goes through a symlink loop"),
                ))
            }
            Err(e) => return Err(Error::internal(format!("reading {skill}/{path}: {e}"))),
        };
        let (encoding, content, length) = page_text(bytes, offset + want as u64 >= size);
        let end = offset.saturating_add(length);
        let path = parts.join("/");
        Ok(Some(Page {
            skill: skill.to_owned(),
            executor_path: self
                .skills_root()
                .map(|root| format!("{root}/{skill}/{path}")),
            path,
            size,
            offset,
            length,
            encoding,
            content,
            eof: end >= size,
            next_offset: (end < size).then_some(end),
            problems,
        }))
    }
}
