//! Who owns a provisioning object (a warm network, its proxy, a helper): the labels that mark
//! them and name the owning process (`<boot id>/<pid namespace>/<pid>`), and whether that
//! process is gone, so that what a process that died left behind is removed by the next.

use crate::engine::{block_on, connect, remove_labelled};
use cloud_harness_error::Result;
use std::collections::HashMap;

/// Marks every container and network of provisioning.
pub(crate) const LABEL: &str = "io.cloud-harness.provisioning";
/// On a warm pair: the process that owns it, `<boot id>/<pid namespace>/<pid>`.
pub(crate) const OWNER: &str = "io.cloud-harness.provisioning.owner";

/// Labels of provisioning objects; `owned` adds this process as the owner.
pub(crate) fn labels(owned: bool) -> HashMap<String, String> {
    let mut labels = HashMap::from([(LABEL.to_owned(), "1".to_owned())]);
    if owned {
        labels.insert(OWNER.to_owned(), owner_of(std::process::id()));
    }
    labels
}

fn boot_and_namespace() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    format!("{}/{ns}", boot.trim())
}

fn owner_of(pid: u32) -> String {
    format!("{}/{pid}", boot_and_namespace())
}

/// Whether a pair owned by `owner` belongs to no living process: one from an earlier boot, or
/// from a process of this boot and pid namespace that is gone. Owners in other namespaces
/// are left alone (their processes cannot be seen from here).
fn orphaned(owner: &str) -> bool {
    let here = boot_and_namespace();
    let Some((place, pid)) = owner.rsplit_once('/') else {
        return false;
    };
    let boot = here.split('/').next().unwrap_or_default();
    if !place.starts_with(boot) {
        return true;
    }
    if place != here {
        return false;
    }
    let Ok(pid) = pid.parse::<i32>() else {
        return false;
    };
    matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// Removes the warm pairs (and any helper) that processes which died left behind.
pub(crate) fn sweep_orphans() -> Result<()> {
    block_on(async {
        let docker = connect().await?;
        remove_labelled(&docker, OWNER, |labels| {
            orphaned(labels.and_then(|l| l.get(OWNER)).map_or("", String::as_str))
        })
        .await
    })
}

#[cfg(test)]
mod tests {
    use super::{orphaned, owner_of};

    #[test]
    fn owners_that_are_gone_are_orphans_and_the_living_and_the_unknown_are_not() {
        assert!(!orphaned(&owner_of(std::process::id())), "this process");
        // No process has this number (above the kernel's pid_max).
        assert!(orphaned(&owner_of(i32::MAX as u32)));
        assert!(orphaned("an-earlier-boot/pid:[4026531836]/1"));
        let here = owner_of(1);
        let (place, _) = here.rsplit_once('/').unwrap();
        let (boot, _) = place.split_once('/').unwrap();
        assert!(
            !orphaned(&format!("{boot}/pid:[1]/12345")),
            "another namespace"
        );
        assert!(!orphaned("no owner at all"));
    }
}
