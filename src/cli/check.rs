//! `cloud-harness skills check DIR`: the skills of a folder held to the Agent Skills
//! specification, as the harness checks every skill it serves. DIR is one skill (it holds a
//! `SKILL.md`) or a folder of skills, found anywhere below it. The exit code is the reference
//! validator's (`agentskills validate`): 0 when every skill follows the specification, 1 when
//! one breaks it or cannot be read as a skill, 2 when DIR is not a folder.

use clap::{Args, ValueEnum};
use cloud_harness_error::{Error, Result};
use cloud_harness_skills::discovery::{read_skill, SkillCache};
use cloud_harness_skills::resolver::Tier;
use cloud_harness_skills::skill::SKILL_MD;
use cloud_harness_skills::spec::{Problem, Rule};
use cloud_harness_skills::stack::dir_source;
use cloud_harness_store::cas::{Limits, Store};
use serde::Serialize;
use serde_json::json;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A skill folder, or a folder of skills.
    pub dir: PathBuf,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// One skill folder's verdict.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Verdict {
    /// Where the folder sits below DIR (`.` for DIR itself).
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    valid: bool,
    problems: Vec<Problem>,
    /// Why it is no skill at all (no front matter, no description, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

pub fn run(args: &CheckArgs) -> Result<u8> {
    if !args.dir.is_dir() {
        let message = format!("{} is not a folder", args.dir.display());
        match args.format {
            Format::Json => println!("{}", json!({ "error": message })),
            Format::Text => eprintln!("error: {message}"),
        }
        return Ok(2);
    }
    let verdicts = verdicts(&args.dir)?;
    let invalid = verdicts.iter().filter(|v| !v.valid).count();
    match args.format {
        Format::Json => println!(
            "{}",
            json!({
                "dir": args.dir.display().to_string(),
                "skills": verdicts,
                "valid": verdicts.len() - invalid,
                "invalid": invalid,
                // The rules the reference validator does not check (the harness's stricter ones).
                "beyondReference": Rule::ALL
                    .iter()
                    .filter(|r| !r.in_reference_validator())
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>(),
            })
        ),
        Format::Text => {
            for v in &verdicts {
                let status = if v.valid { "valid  " } else { "INVALID" };
                println!("{status} {}", v.path);
                if let Some(e) = &v.error {
                    println!("  - {e}");
                }
                for p in &v.problems {
                    println!("  - {}: {}", p.rule, p.message);
                }
            }
            println!(
                "{} skills: {} valid, {invalid} breaking the Agent Skills specification",
                verdicts.len(),
                verdicts.len() - invalid
            );
        }
    }
    Ok(if invalid > 0 || verdicts.is_empty() {
        1
    } else {
        0
    })
}

/// Every skill folder of `dir` checked, in a store of its own that goes when the check ends.
fn verdicts(dir: &std::path::Path) -> Result<Vec<Verdict>> {
    let scratch = tempfile::tempdir().map_err(|e| Error::internal(e.to_string()))?;
    let store = Store::open(scratch.path().join("store"))?;
    let cache = SkillCache::default();
    if dir.join(SKILL_MD).is_file() {
        // DIR is one skill: its folder's name is the one its `name` must match.
        let imported = store.import_dir(dir, &Limits::default())?;
        // Its name as the path gives it, `.` and `..` resolved (a link keeps its own name, as
        // an agent's loader sees it).
        let folder = lexical_name(dir);
        let read = read_skill(&store, folder.as_deref(), &imported.digest);
        return Ok(vec![match read {
            Ok(info) => Verdict {
                path: ".".into(),
                name: info.meta.declared_name.clone(),
                valid: info.problems.is_empty(),
                problems: info.problems.clone(),
                error: None,
            },
            Err(e) => Verdict {
                path: ".".into(),
                name: None,
                valid: false,
                problems: Vec::new(),
                error: Some(e.message),
            },
        }]);
    }
    let source = dir_source(&store, &cache, Tier::Owner, dir, None)?;
    let mut out: Vec<Verdict> = source
        .discovery
        .skills
        .iter()
        .map(|f| Verdict {
            path: f.path.clone(),
            name: Some(f.name.to_string()),
            valid: f.info.problems.is_empty(),
            problems: f.info.problems.clone(),
            error: None,
        })
        .collect();
    out.extend(source.discovery.skipped.iter().map(|s| Verdict {
        path: s.path.clone(),
        name: None,
        valid: false,
        problems: Vec::new(),
        error: Some(format!("{}: {}", s.code, s.reason)),
    }));
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The last name of `dir` once `.` and `..` are resolved by the path alone (no link followed).
fn lexical_name(dir: &std::path::Path) -> Option<String> {
    use std::path::Component;
    let absolute = std::path::absolute(dir).ok()?;
    let mut names: Vec<std::ffi::OsString> = Vec::new();
    for part in absolute.components() {
        match part {
            Component::Normal(name) => names.push(name.to_owned()),
            Component::ParentDir => {
                names.pop();
            }
            _ => {}
        }
    }
    names.last().map(|n| n.to_string_lossy().into_owned())
}
