//! The tier stack: turning trees in the store and directories on disk into resolver sources.
//!
//! A directory is snapshotted into the store first, so every generation is served from
//! immutable, verified objects; unchanged files cost a hash and no write.

use crate::discovery::{discover, Layout, SkillCache};
use cloud_harness_store::cas::{Digest, Limits, Store};

use crate::resolver::{Provenance, Source, Tier};
use cloud_harness_error::{Error, Result};
use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The folders of a project that hold its own skills (the repository tier), in order.
pub const REPOSITORY_SKILL_DIRS: [&str; 2] = [".agents/skills", ".claude/skills"];

/// A source from a tree already in the store (a bundle, the built-in tier).
pub fn tree_source(
    store: &Store,
    cache: &SkillCache,
    id: String,
    tier: Tier,
    provenance: Provenance,
    tree: Digest,
    layout: &Layout,
) -> Result<Source> {
    let discovery = discover(store, &tree, layout, cache)?;
    Ok(Source {
        id,
        tier,
        provenance,
        tree,
        discovery,
    })
}

/// A source from a folder of skills on disk, found anywhere below it. Its id is
/// `<tier>:<absolute path>`. With `project`, the folder belongs to that project (hostile
/// content): it must lead nowhere outside it, and the project ceilings apply.
pub fn dir_source(
    store: &Store,
    cache: &SkillCache,
    tier: Tier,
    dir: &Path,
    project: Option<&Path>,
) -> Result<Source> {
    // A project's folder is named as the project names it, in errors and warnings: the
    // host's own layout is nobody's business.
    let (fd, abs, limits, named) = match project {
        Some(root) => {
            let (fd, real) = open_beneath(root, dir)?;
            let named = absolute(root)
                .ok()
                .and_then(|r| real.strip_prefix(r).ok().map(Path::to_path_buf))
                .unwrap_or_else(|| dir.strip_prefix(root).unwrap_or(dir).to_path_buf());
            (fd, real, Limits::PROJECT, named)
        }
        None => {
            let abs = absolute(dir)?;
            (
                cloud_harness_store::cas::open_dir(&abs)?,
                abs.clone(),
                Limits::default(),
                abs,
            )
        }
    };
    let imported = store.import_fd(fd, &named, &limits)?;
    let path = abs.to_string_lossy().into_owned();
    let mut source = tree_source(
        store,
        cache,
        format!("{tier}:{path}"),
        tier,
        Provenance {
            path: Some(path),
            ..Provenance::default()
        },
        imported.digest,
        &Layout::folder(),
    )?;
    let shown = match project {
        Some(_) => format!("the project's {}", named.display()),
        None => named.display().to_string(),
    };
    // At most `MAX_LEFT_OUT` named, then how many more: they are kept with the generation
    // and sent in every listing.
    source.discovery.warnings.extend(
        imported
            .left_out
            .iter()
            .map(|(at, why)| format!("{shown}/{}: {why}; it is left out", at.display())),
    );
    if imported.left_out_more > 0 {
        source.discovery.warnings.push(format!(
            "{shown}: {} more entries no skill can hold are left out (the first {} are named)",
            imported.left_out_more,
            cloud_harness_store::cas::MAX_LEFT_OUT
        ));
    }
    Ok(source)
}

/// The repository tier of the project at `root`: one source for each of its skill folders
/// that exists.
pub fn repository_sources(store: &Store, cache: &SkillCache, root: &Path) -> Result<Vec<Source>> {
    let root = absolute(root)?;
    if !root.is_dir() {
        return Err(Error::invalid(format!(
            "{} is not a project directory",
            root.display()
        )));
    }
    let mut out = Vec::new();
    for sub in REPOSITORY_SKILL_DIRS {
        let dir = root.join(sub);
        if dir.is_dir() {
            out.push(dir_source(
                store,
                cache,
                Tier::Repository,
                &dir,
                Some(&root),
            )?);
        }
    }
    Ok(out)
}

/// Opens the project's folder `dir` so that nothing on the way leads outside the project
/// `root` (a link such as `.agents/skills -> /` would otherwise serve, and import, the host's
/// own files), and returns it with its real path. The kernel resolves the path beneath the
/// project (`openat2`, `RESOLVE_BENEATH`), in one step: a link swapped in after a check cannot
/// win a race against it.
fn open_beneath(root: &Path, dir: &Path) -> Result<(OwnedFd, PathBuf)> {
    // Named as the project names it: the host's own layout is nobody's business.
    let shown = dir.strip_prefix(root).unwrap_or(dir);
    let outside = || {
        Error::new(
            cloud_harness_error::Code::Forbidden,
            format!(
                "the project's {} is a link that leads outside the project; it is not served",
                shown.display()
            ),
        )
        .with_details(serde_json::json!({ "path": shown }))
    };
    let Ok(rel) = dir.strip_prefix(root) else {
        return Err(outside());
    };
    let root_fd = nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(root, e.into()))?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = match openat2(&root_fd, rel, how) {
        Ok(fd) => fd,
        Err(Errno::EXDEV) => return Err(outside()),
        Err(Errno::ENOSYS) => return lexically_beneath(root, dir).map_err(|_| outside()),
        Err(e) => return Err(Error::io(dir, e.into())),
    };
    let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| Error::io(dir, e))?;
    Ok((fd, real))
}

/// Where `openat2` is missing (kernels before 5.6, old container seccomp profiles): the real
/// path is checked, then opened. A link swapped in between is still not followed below the
/// folder (the import walks by descriptor), but the folder itself could be replaced.
fn lexically_beneath(root: &Path, dir: &Path) -> Result<(OwnedFd, PathBuf)> {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!("openat2 is not available: a project's skill folders are checked by their real path, then opened")
    });
    let real = absolute(dir)?;
    if !real.starts_with(absolute(root)?) {
        return Err(Error::invalid("outside"));
    }
    Ok((cloud_harness_store::cas::open_dir(&real)?, real))
}

fn absolute(dir: &Path) -> Result<PathBuf> {
    // canonicalize: the source id names the real folder, and a folder reached through a
    // symlink (a common repository-root shape) is read where it really is.
    dir.canonicalize().map_err(|e| Error::io(dir, e))
}

/// Everything a tier stack is made of. Folders are read again for each generation; sources
/// already in the store (the built-in tier, toolkit bundles) are fixed.
#[derive(Debug, Clone, Default)]
pub struct StackSpec {
    pub trees: Vec<Source>,
    /// Folders of skills on disk, each one source of its tier.
    pub dirs: Vec<(Tier, PathBuf)>,
    /// A project whose `.agents/skills` and `.claude/skills` form the repository tier.
    pub repository: Option<PathBuf>,
    pub overrides: Vec<crate::resolver::Override>,
    /// A project whose folders `dirs` are (the workspace tier of a working tree): they must
    /// stay beneath it, with the project ceilings.
    pub confine: Option<PathBuf>,
}

impl StackSpec {
    /// Reads the folders and returns every source, in tier order as given.
    pub fn sources(&self, store: &Store, cache: &SkillCache) -> Result<Vec<Source>> {
        let mut sources = self.trees.clone();
        for (tier, dir) in &self.dirs {
            sources.push(dir_source(
                store,
                cache,
                *tier,
                dir,
                self.confine.as_deref(),
            )?);
        }
        if let Some(root) = &self.repository {
            sources.extend(repository_sources(store, cache, root)?);
        }
        let mut seen = std::collections::HashSet::new();
        for s in &sources {
            if !seen.insert(s.id.as_str()) {
                return Err(Error::invalid(format!("source {} is given twice", s.id)));
            }
        }
        Ok(sources)
    }

    pub fn resolve(&self, store: &Store, cache: &SkillCache) -> Result<crate::resolver::Index> {
        Ok(crate::resolver::resolve(
            &self.sources(store, cache)?,
            &self.overrides,
        ))
    }

    pub fn generation(
        &self,
        store: &Store,
        cache: &SkillCache,
    ) -> Result<crate::generation::Generation> {
        Ok(crate::generation::Generation::build(
            &self.sources(store, cache)?,
            &self.overrides,
        ))
    }

    /// The folders whose changes make a new generation: every skill folder (all of it), and
    /// the project folders where `.agents/skills` or `.claude/skills` may appear (their own
    /// entries only). A project's folders are confined to the project.
    pub fn live_paths(&self) -> Vec<LivePath> {
        let mut out: Vec<LivePath> = self
            .dirs
            .iter()
            .map(|(_, d)| LivePath {
                path: d.clone(),
                whole: true,
                beneath: self.confine.clone(),
            })
            .collect();
        if let Some(root) = &self.repository {
            let at = |path: PathBuf, whole: bool| LivePath {
                path,
                whole,
                beneath: Some(root.clone()),
            };
            out.push(at(root.clone(), false));
            for sub in REPOSITORY_SKILL_DIRS {
                let dir = root.join(sub);
                if let Some(parent) = dir.parent() {
                    out.push(at(parent.to_path_buf(), false));
                }
                out.push(at(dir, true));
            }
        }
        out
    }
}

/// A folder whose changes make a new generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePath {
    pub path: PathBuf,
    /// Everything below it counts, not only its own entries.
    pub whole: bool,
    /// The project it belongs to: reached only beneath it, and named from it.
    pub beneath: Option<PathBuf>,
}

impl LivePath {
    /// Opens the folder, never leading outside its project.
    pub fn open(&self) -> Result<OwnedFd> {
        match &self.beneath {
            Some(root) if root != &self.path => Ok(open_beneath(root, &self.path)?.0),
            _ => cloud_harness_store::cas::open_dir(&self.path),
        }
    }

    /// How warnings name it: from its project, else as it is.
    pub fn shown(&self) -> String {
        match &self.beneath {
            Some(root) => match self.path.strip_prefix(root) {
                Ok(rel) if rel.as_os_str().is_empty() => "the project".to_owned(),
                Ok(rel) => format!("the project's {}", rel.display()),
                Err(_) => "a folder of the project".to_owned(),
            },
            None => self.path.display().to_string(),
        }
    }
}
