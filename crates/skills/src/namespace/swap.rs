//! A generation swap: what the kernel must forget when a new generation becomes current (names
//! whose entries changed, negative entries for names that appeared, listings that changed),
//! as far as the kernel knows the directories involved.

use super::{Ident, Invalidation, Namespace, Reach, RESOLUTION_FILE, ROOT_INO};
use crate::generation::{Generation, View};
use crate::relpath;
use crate::resolver::Tier;
use cloud_harness_store::cas::{Digest, Kind};
use std::collections::BTreeSet;
use std::sync::Arc;

impl Namespace {
    /// Makes `next` current and returns what the kernel must forget: every name whose entry
    /// changed (including names that appeared, to drop negative entries) and every directory
    /// whose listing changed, as far as the kernel knows those directories.
    pub fn set_generation(&self, next: Arc<Generation>) -> Vec<Invalidation> {
        let prev = std::mem::replace(
            &mut *self.current.write().expect("generation lock"),
            next.clone(),
        );
        let mut out = Vec::new();

        let root_view = self.root_view;
        let mut root_changed = self.diff_view(&prev, &next, root_view, ROOT_INO, &mut out);
        if self.root_is_merged() {
            if prev.resolution_digest != next.resolution_digest {
                out.push(Invalidation::Entry {
                    parent: ROOT_INO,
                    name: RESOLUTION_FILE.into(),
                });
                root_changed = true;
            }
            if let Some(tiers_ino) = self.known(&Ident::TiersDir) {
                let before: BTreeSet<Tier> = prev.tiers().collect();
                let after: BTreeSet<Tier> = next.tiers().collect();
                for t in before.symmetric_difference(&after) {
                    out.push(Invalidation::Entry {
                        parent: tiers_ino,
                        name: t.to_string(),
                    });
                }
                if before != after {
                    out.push(Invalidation::Inode { ino: tiers_ino });
                }
            }
            for tier in Tier::ALL {
                if let Some(ino) = self.known(&Ident::TierDir(tier)) {
                    if self.diff_view(&prev, &next, View::Tier(tier), ino, &mut out) {
                        out.push(Invalidation::Inode { ino });
                    }
                }
            }
        }
        if root_changed {
            out.push(Invalidation::Inode { ino: ROOT_INO });
        }
        out
    }

    /// Differences of one view between generations; true when its listing changed.
    fn diff_view(
        &self,
        prev: &Generation,
        next: &Generation,
        view: View,
        parent: u64,
        out: &mut Vec<Invalidation>,
    ) -> bool {
        let (a, b) = (prev.view(view), next.view(view));
        let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        let mut changed = false;
        for name in names {
            let (old, new) = (a.get(name), b.get(name));
            if old == new {
                continue;
            }
            changed = true;
            match (old, new) {
                (Some(o), Some(n)) if o.digest != n.digest => {
                    // Same folder, new content: its inode stays, its children may not.
                    let ident = Ident::SkillDir {
                        view,
                        skill: name.as_str().into(),
                        rel: "".into(),
                    };
                    self.diff_tree(&ident, &o.digest, &n.digest, out);
                }
                (Some(_), Some(_)) => {} // only the provenance changed
                _ => out.push(Invalidation::Entry {
                    parent,
                    name: name.clone(),
                }),
            }
        }
        changed
    }

    /// Differences inside a skill folder the kernel knows.
    fn diff_tree(&self, dir: &Ident, old: &Digest, new: &Digest, out: &mut Vec<Invalidation>) {
        let Some(ino) = self.known(dir).filter(|_| old != new) else {
            return;
        };
        let (Ok(a), Ok(b)) = (self.tree(old, Reach::Store), self.tree(new, Reach::Store)) else {
            out.push(Invalidation::Inode { ino });
            return;
        };
        let Ident::SkillDir { view, skill, rel } = dir else {
            return;
        };
        let names: BTreeSet<&str> = a
            .entries()
            .iter()
            .chain(b.entries())
            .map(|e| e.name.as_str())
            .collect();
        for name in names {
            let (x, y) = (a.get(name), b.get(name));
            if x == y {
                continue;
            }
            match (x, y) {
                (Some(x), Some(y)) if x.kind == Kind::Tree && y.kind == Kind::Tree => {
                    let child = Ident::SkillDir {
                        view: *view,
                        skill: skill.clone(),
                        rel: relpath::join(rel, name).into(),
                    };
                    self.diff_tree(&child, &x.digest, &y.digest, out);
                }
                _ => out.push(Invalidation::Entry {
                    parent: ino,
                    name: name.to_owned(),
                }),
            }
        }
        out.push(Invalidation::Inode { ino });
    }
}
