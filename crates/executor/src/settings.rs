//! What the operator chooses of executors (`CLOUD_HARNESS_EXECUTOR*`): the backend, the
//! network, the user commands run as, the spares kept.

use cloud_harness_error::{Error, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Docker,
    Bwrap,
    Host,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Docker => "docker",
            Kind::Bwrap => "bwrap",
            Kind::Host => "host",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Loopback only.
    None,
    /// Through the egress proxy, to `CLOUD_HARNESS_EXECUTOR_ALLOWED_HOSTS` only.
    Egress,
}

/// What `CLOUD_HARNESS_EXECUTOR` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Auto,
    /// No executor: skills are served and read, scripts never run.
    Off,
    Only(Kind),
}

/// The operator's executor settings (`CLOUD_HARNESS_EXECUTOR*`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub choice: Choice,
    pub network: Network,
    /// Hosts the executor may reach with `network: egress`.
    pub allowed_hosts: String,
    /// An operator's own image for the docker backend, instead of the host's userland.
    pub image: Option<String>,
    pub uid: u32,
    pub gid: u32,
    /// Docker executors kept created and started for the next opens
    /// (`CLOUD_HARNESS_EXECUTOR_SPARES`, 2 by default; none with `network: egress`).
    pub spares: usize,
}

/// The uid and gid commands run as when the harness runs as root.
pub(crate) const DEFAULT_UID: u32 = 10001;

/// Whether bubblewrap is installed.
fn bubblewrap_installed() -> bool {
    std::process::Command::new("bwrap")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Settings {
    pub fn from_env() -> Result<Settings> {
        let choice = match env("CLOUD_HARNESS_EXECUTOR").as_deref().map(str::trim) {
            None | Some("auto") => Choice::Auto,
            Some("docker") => Choice::Only(Kind::Docker),
            Some("bwrap") => Choice::Only(Kind::Bwrap),
            Some("host") => Choice::Only(Kind::Host),
            Some("none") => Choice::Off,
            Some(other) => {
                return Err(Error::invalid(format!(
                    "CLOUD_HARNESS_EXECUTOR={other:?}: use auto, docker, bwrap, host or none"
                )))
            }
        };
        let network = match env("CLOUD_HARNESS_EXECUTOR_NETWORK")
            .as_deref()
            .map(str::trim)
        {
            None | Some("none") => Network::None,
            Some("egress") => Network::Egress,
            Some(other) => {
                return Err(Error::invalid(format!(
                    "CLOUD_HARNESS_EXECUTOR_NETWORK={other:?}: use none or egress"
                )))
            }
        };
        let allowed_hosts = env("CLOUD_HARNESS_EXECUTOR_ALLOWED_HOSTS").unwrap_or_default();
        if !allowed_hosts.is_empty() {
            cloud_harness_control::hosts::HostPolicy::new(&allowed_hosts, "").map_err(|e| {
                Error::invalid(format!(
                    "CLOUD_HARNESS_EXECUTOR_ALLOWED_HOSTS: {}",
                    e.message
                ))
            })?;
        }
        if network == Network::Egress && allowed_hosts.is_empty() {
            return Err(Error::invalid(
                "CLOUD_HARNESS_EXECUTOR_NETWORK=egress needs CLOUD_HARNESS_EXECUTOR_ALLOWED_HOSTS",
            ));
        }
        let root = nix::unistd::geteuid().is_root();
        let id = |name: &str, default: u32| -> Result<u32> {
            match env(name) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse()
                    .map_err(|_| Error::invalid(format!("{name}={v:?} is not a number"))),
            }
        };
        // As root, commands run as an unprivileged uid of their own; otherwise as this user.
        let (uid, gid) = if root {
            let uid = id("CLOUD_HARNESS_EXECUTOR_UID", DEFAULT_UID)?;
            if uid == 0 {
                return Err(Error::invalid(
                    "CLOUD_HARNESS_EXECUTOR_UID=0: commands never run as root",
                ));
            }
            (uid, uid)
        } else {
            (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            )
        };
        let spares = id("CLOUD_HARNESS_EXECUTOR_SPARES", 2)? as usize;
        // Read where a sandbox is made; checked here, so a typo stops the start.
        crate::cgroup::choice_from_env()?;
        if spares > 64 {
            return Err(Error::invalid("CLOUD_HARNESS_EXECUTOR_SPARES: at most 64"));
        }
        Ok(Settings {
            choice,
            network,
            allowed_hosts,
            image: env("CLOUD_HARNESS_EXECUTOR_IMAGE"),
            uid,
            gid,
            spares,
        })
    }

    /// The defaults (no network, the default uid as root, no spares) with `kind` chosen: for
    /// tests and benchmarks, which must not depend on the environment.
    pub fn with_kind(kind: Kind) -> Settings {
        let root = nix::unistd::geteuid().is_root();
        let (uid, gid) = if root {
            (DEFAULT_UID, DEFAULT_UID)
        } else {
            (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            )
        };
        Settings {
            choice: Choice::Only(kind),
            network: Network::None,
            allowed_hosts: String::new(),
            image: None,
            uid,
            gid,
            spares: 0,
        }
    }

    /// How many spare executors to keep for `kind`: Docker's without egress (an egress
    /// executor's network is made for its workspace), else none.
    pub fn spares_for(&self, kind: Option<Kind>) -> usize {
        match (kind, self.network) {
            (Some(Kind::Docker), Network::None) => self.spares,
            _ => 0,
        }
    }

    /// The backend to use: the one asked for, or (`auto`) docker when an engine answers and
    /// this is root, else bwrap when bubblewrap is installed, else none.
    pub fn kind(&self) -> Result<Option<Kind>> {
        let kind = match self.choice {
            Choice::Only(kind) => Some(kind),
            Choice::Auto
                if nix::unistd::geteuid().is_root()
                    && cloud_harness_provision::engine::version().is_some() =>
            {
                Some(Kind::Docker)
            }
            Choice::Auto if bubblewrap_installed() => Some(Kind::Bwrap),
            Choice::Auto | Choice::Off => None,
        };
        // The container's agent is root without the capability to enter a folder of another
        // user's: its socket folder must be root's.
        if kind == Some(Kind::Docker) && !nix::unistd::geteuid().is_root() {
            return Err(Error::invalid(
                "the docker executor needs the harness to run as root (its agent's socket folder is root's); as another user, use CLOUD_HARNESS_EXECUTOR=bwrap",
            ));
        }
        // The proxy's listener is made in the sandbox's network namespace, which takes
        // entering it (CAP_SYS_ADMIN).
        if kind == Some(Kind::Bwrap)
            && self.network == Network::Egress
            && !nix::unistd::geteuid().is_root()
        {
            return Err(Error::invalid(
                "CLOUD_HARNESS_EXECUTOR_NETWORK=egress with bubblewrap needs the harness to run as root (its proxy listens inside each sandbox's network namespace)",
            ));
        }
        Ok(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud_harness_error::Code;

    #[test]
    fn egress_with_bubblewrap_needs_root() {
        let settings = Settings {
            network: Network::Egress,
            allowed_hosts: "example.test".into(),
            ..Settings::with_kind(Kind::Bwrap)
        };
        if nix::unistd::geteuid().is_root() {
            assert_eq!(settings.kind().unwrap(), Some(Kind::Bwrap));
        } else {
            let err = settings.kind().unwrap_err();
            assert_eq!(err.code, Code::InvalidArgument);
            assert!(err.message.contains("root"), "{err}");
        }
        let settings = Settings {
            network: Network::Egress,
            ..Settings::with_kind(Kind::Docker)
        };
        assert_eq!(settings.kind().unwrap(), Some(Kind::Docker));
    }
}
