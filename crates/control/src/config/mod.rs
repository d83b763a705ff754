//! The configuration file: every setting the book lists as an environment variable
//! (docs/operating.md, "Configuration") has a key in a TOML file (`--config FILE`,
//! `CLOUD_HARNESS_CONFIG`, else `/etc/cloud-harness/config.toml` when it exists). The
//! environment beats the file, the file beats the default. A file's values are checked here —
//! an unknown key or a value of the wrong kind is an error naming the key and its line — and
//! then handed to the code as the environment variables it reads, before anything else runs.

use cloud_harness_error::{Code, Error, Result};
use serde_json::json;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// A whole number from the environment variable `name`, or `default` when it is unset.
pub fn env_number(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| Error::invalid(format!("{name}: {v:?} is not a whole number"))),
        Err(_) => Ok(default),
    }
}

mod settings;
pub(crate) use settings::{Kind, Setting, SETTINGS};

/// Where a file is looked for when none is named.
pub(crate) const DEFAULT_PATH: &str = "/etc/cloud-harness/config.toml";

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    Environment,
    /// The file and the line of the key.
    File(PathBuf, usize),
    Default,
}

/// One setting as it takes effect.
#[derive(Debug)]
pub struct Effective {
    pub setting: &'static Setting,
    /// `None`: the default.
    pub value: Option<String>,
    pub origin: Origin,
}

/// A file's values, checked, as the variables they stand for.
#[derive(Debug, Default)]
pub struct Config {
    pub path: Option<PathBuf>,
    /// (setting, value as its variable takes it, line).
    values: Vec<(&'static Setting, String, usize)>,
}

/// The file `args` name with `--config FILE` (or `--config=FILE`), if any: read before the
/// command line is parsed, since the file feeds the variables its parsing reads.
pub(crate) fn path_in_args(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let a = a.to_str()?;
        if a == "--" {
            return None;
        }
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(p) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(p));
        }
    }
    None
}

/// The file to read: the one named, else `CLOUD_HARNESS_CONFIG`, else the default path when
/// it exists (a named file that is missing is an error; a missing default is no file).
pub fn which(named: Option<PathBuf>) -> Option<PathBuf> {
    named
        .or_else(|| {
            std::env::var_os("CLOUD_HARNESS_CONFIG")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .or_else(|| Some(PathBuf::from(DEFAULT_PATH)).filter(|p| p.exists()))
}

fn setting(key: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.key == key)
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|b| *b == b'\n')
        .count()
        + 1
}

fn bad(path: &Path, line: usize, key: &str, message: String) -> Error {
    Error::new(
        Code::InvalidArgument,
        format!("{}:{line}: {message}", path.display()),
    )
    .with_details(json!({ "field": key, "file": path.display().to_string(), "line": line }))
}

impl Config {
    /// Reads and checks the file at `path`.
    pub fn read(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::new(
                Code::InvalidArgument,
                format!("cannot read the configuration file {}: {e}", path.display()),
            )
        })?;
        Config::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Config> {
        use toml::de::{DeTable, DeValue};
        let doc = DeTable::parse(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(1);
            Error::new(
                Code::InvalidArgument,
                format!("{}:{line}: not TOML: {}", path.display(), e.message()),
            )
            .with_details(json!({ "file": path.display().to_string(), "line": line }))
        })?;
        let mut config = Config {
            path: Some(path.to_owned()),
            values: Vec::new(),
        };
        let mut pending = vec![(String::new(), doc.get_ref())];
        while let Some((prefix, table)) = pending.pop() {
            for (k, v) in table.iter() {
                let key = if prefix.is_empty() {
                    k.get_ref().to_string()
                } else {
                    format!("{prefix}.{}", k.get_ref())
                };
                let line = line_of(text, k.span().start);
                let value = v.get_ref();
                if let DeValue::Table(inner) = value {
                    if SETTINGS
                        .iter()
                        .any(|s| s.key.starts_with(&format!("{key}.")))
                    {
                        pending.push((key, inner));
                        continue;
                    }
                }
                let Some(s) = setting(&key) else {
                    return Err(bad(
                        path,
                        line,
                        &key,
                        format!("unknown key `{key}` (the keys are {})", keys()),
                    ));
                };
                let as_env = value_of(s, value)
                    .map_err(|m| bad(path, line, &key, format!("`{key}` {m}")))?;
                config.values.push((s, as_env, line));
            }
        }
        config.values.sort_by_key(|(_, _, line)| *line);
        Ok(config)
    }

    /// Hands the file's values to the code as the variables it reads, where the environment
    /// does not set them already. Called first thing in `main`, while no other thread runs.
    pub fn apply(&self) {
        for (s, v, _) in &self.values {
            // An empty variable counts as unset, as everywhere else.
            if std::env::var_os(s.env).is_none_or(|v| v.is_empty()) {
                std::env::set_var(s.env, v);
            }
        }
    }

    /// Every setting, with the value that takes effect and where it came from. `env` is the
    /// environment as it was before [`Config::apply`]; its values are checked too.
    pub(crate) fn effective(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<Effective>> {
        SETTINGS
            .iter()
            .map(|s| {
                if let Some(v) = env(s.env) {
                    check_env(s, &v)?;
                    return Ok(Effective {
                        setting: s,
                        value: Some(v),
                        origin: Origin::Environment,
                    });
                }
                match self.values.iter().find(|(f, _, _)| std::ptr::eq(*f, s)) {
                    Some((_, v, line)) => Ok(Effective {
                        setting: s,
                        value: Some(v.clone()),
                        origin: Origin::File(self.path.clone().unwrap_or_default(), *line),
                    }),
                    None => Ok(Effective {
                        setting: s,
                        value: None,
                        origin: Origin::Default,
                    }),
                }
            })
            .collect()
    }
}

fn keys() -> String {
    SETTINGS
        .iter()
        .map(|s| s.key)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A file's value as the variable takes it, or what is wrong with it.
fn value_of(s: &Setting, v: &toml::de::DeValue) -> std::result::Result<String, String> {
    use toml::de::DeValue;
    match (s.kind, v) {
        (Kind::Text | Kind::Path, DeValue::String(t)) => Ok(t.to_string()),
        (Kind::Number, DeValue::Integer(i)) if i.radix() == 10 => i
            .as_str()
            .replace('_', "")
            .parse::<u64>()
            .map(|n| n.to_string())
            .map_err(|_| format!("must be a whole number, not {}", i.as_str())),
        (Kind::List, DeValue::Array(items)) => items
            .iter()
            .map(|i| match i.get_ref() {
                DeValue::String(t) if !t.contains(',') => Ok(t.to_string()),
                _ => Err("must be an array of strings without commas".to_owned()),
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(|all| all.join(",")),
        (Kind::Choice(words), DeValue::String(t)) if words.contains(&t.as_ref()) => {
            Ok(t.to_string())
        }
        (Kind::Choice(words), _) => Err(format!("must be one of {}", words.join(", "))),
        (Kind::Text | Kind::Path, _) => Err("must be a string".to_owned()),
        (Kind::Number, _) => Err("must be a whole number".to_owned()),
        (Kind::List, _) => Err("must be an array of strings".to_owned()),
    }
}

/// A value the environment gives, checked as the file's would be.
fn check_env(s: &Setting, v: &str) -> Result<()> {
    let ok = match s.kind {
        Kind::Number => v.parse::<u64>().is_ok(),
        Kind::Choice(words) => words.contains(&v),
        Kind::Text | Kind::Path | Kind::List => true,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::field(
            Code::InvalidArgument,
            s.key,
            format!(
                "the environment's {}={v:?} is not {}",
                s.env,
                describe(s.kind)
            ),
        ))
    }
}

fn describe(kind: Kind) -> String {
    match kind {
        Kind::Number => "a whole number".into(),
        Kind::Choice(words) => format!("one of {}", words.join(", ")),
        _ => "valid".into(),
    }
}

/// The settings' variables as the environment gave them, before a file was applied.
static BEFORE: std::sync::OnceLock<Vec<(&'static str, String)>> = std::sync::OnceLock::new();

/// First thing in `main`: the file `args` name (or the default one) read, checked and applied.
/// `config …` commands read their file themselves, so a bad file can be checked.
pub fn init(args: &[OsString]) -> Result<()> {
    let before = SETTINGS
        .iter()
        .filter_map(|s| Some((s.env, std::env::var(s.env).ok().filter(|v| !v.is_empty())?)))
        .collect();
    let _ = BEFORE.set(before);
    // The first word that is neither an option nor the value of one that takes a value.
    let mut words = args.iter().skip(1).filter_map(|a| a.to_str());
    let mut command = None;
    while let Some(w) = words.next() {
        if matches!(w, "--config" | "--store" | "--log-format") {
            words.next();
        } else if !w.starts_with('-') {
            command = Some(w);
            break;
        }
    }
    if command == Some("config") {
        return Ok(());
    }
    if let Some(path) = which(path_in_args(args)) {
        Config::read(&path)?.apply();
    }
    Ok(())
}

fn before(name: &str) -> Option<String> {
    match BEFORE.get() {
        Some(all) => all.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone()),
        None => std::env::var(name).ok(),
    }
}

/// `cloud-harness config check`: the file checked, every setting printed with its value and
/// where it came from.
pub fn check(named: Option<PathBuf>) -> Result<String> {
    let env_before: &dyn Fn(&str) -> Option<String> = &before;
    let config = match which(named) {
        Some(p) => Config::read(&p)?,
        None => Config::default(),
    };
    let mut out = match &config.path {
        Some(p) => format!("# {}: valid\n", p.display()),
        None => format!("# no configuration file ({DEFAULT_PATH} does not exist): defaults and the environment\n"),
    };
    for e in config.effective(env_before)? {
        let from = match &e.origin {
            Origin::Environment => format!("environment {}", e.setting.env),
            Origin::File(p, line) => format!("{}:{line}", p.display()),
            Origin::Default => "default".to_owned(),
        };
        let shown = match &e.value {
            Some(v) if ["HTTPS_PROXY", "CLOUD_HARNESS_DATABASE_URL"].contains(&e.setting.env) => {
                redact(v)
            }
            Some(v) => v.clone(),
            None => format!("({})", e.setting.default),
        };
        out.push_str(&format!("{:<30} = {shown}  # {from}\n", e.setting.key));
    }
    Ok(out)
}

/// A URL's password (a proxy's, the database's) stays out of what is printed and logged:
/// `scheme://user:***@host…`.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
            None => url.to_owned(),
        },
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn a_password_in_a_url_is_never_shown_and_the_rest_is() {
        assert_eq!(
            redact("postgres://harness:s3cret@db:5432/ch?sslmode=disable"),
            "postgres://harness:***@db:5432/ch?sslmode=disable"
        );
        assert_eq!(
            redact("http://u:p@ss:w@proxy:3128"),
            "http://u:***@proxy:3128"
        );
        assert_eq!(
            redact("postgres://harness@db/ch"),
            "postgres://harness@db/ch"
        );
        assert_eq!(redact("http://proxy:3128"), "http://proxy:3128");
    }
}
