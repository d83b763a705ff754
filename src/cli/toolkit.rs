//! `cloud-harness toolkit …`

use super::skills::short;
use clap::{Args, Subcommand};
use cloud_harness_control::presets;
use cloud_harness_control::toolkit::{
    self, GitSpec, LayoutSpec, PresetSpec, Scope, SkillFilter, ToolkitSpec,
};
use cloud_harness_error::{Error, Result};
use cloud_harness_provision::index::BundleIndex;
use cloud_harness_provision::observe::Observer;
use cloud_harness_provision::Provisioner;
use cloud_harness_store::cas::Store;

#[derive(Debug, Subcommand)]
pub enum ToolkitCommand {
    /// Acquire a preset or a git toolkit into the store (warm when already there).
    Add(Box<AddArgs>),
    /// The bundles in the store: digests, sources, skill counts.
    List {
        #[arg(long)]
        json: bool,
    },
    /// The preset registry.
    Presets {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The whole spec as JSON, as workspace_open takes it.
    #[arg(long, value_name = "JSON", conflicts_with_all = ["preset", "url"])]
    pub spec: Option<String>,
    /// A preset id, e.g. obra/superpowers.
    #[arg(long, value_name = "ID", conflicts_with = "url")]
    pub preset: Option<String>,
    /// With --preset: a commit id or a tag (default: the default branch head).
    #[arg(long, requires = "preset")]
    pub version: Option<String>,
    /// An HTTPS git URL on ALLOWED_GIT_HOSTS.
    #[arg(long)]
    pub url: Option<String>,
    /// With --url: the toolkit's name in this workspace.
    #[arg(long, value_name = "ID", requires = "url")]
    pub instance_id: Option<String>,
    /// With --url: an exact commit id (default: the default branch head).
    #[arg(long = "ref", value_name = "COMMIT", requires = "url")]
    pub git_ref: Option<String>,
    #[arg(long, requires = "url")]
    pub subdirectory: Option<String>,
    /// Folders to search for skills (repeatable; default `skills`).
    #[arg(long = "skill-root", value_name = "DIR", requires = "url")]
    pub skill_roots: Vec<String>,
    /// Look only one level below each skill root.
    #[arg(long, requires = "url")]
    pub not_recursive: bool,
    /// Install only the skills the toolkit's plugin manifest lists.
    #[arg(long, requires = "url")]
    pub plugin_manifest: bool,
    /// Skill names or glob patterns to take (repeatable).
    #[arg(long, requires = "url")]
    pub include: Vec<String>,
    /// Skill names or glob patterns to leave out (repeatable).
    #[arg(long, requires = "url")]
    pub exclude: Vec<String>,
    #[arg(long, value_parser = ["owner", "workspace"])]
    pub scope: Option<String>,
    #[arg(long)]
    pub json: bool,
}

impl AddArgs {
    fn spec(&self) -> Result<ToolkitSpec> {
        let scope = match self.scope.as_deref() {
            Some("workspace") => Some(Scope::Workspace),
            Some(_) => Some(Scope::Owner),
            None => None,
        };
        if let Some(json) = &self.spec {
            return toolkit::parse_spec(json);
        }
        if let Some(id) = &self.preset {
            return Ok(ToolkitSpec::Preset(PresetSpec {
                id: id.clone(),
                scope,
                version: self.version.clone(),
                label: None,
            }));
        }
        let Some(url) = &self.url else {
            return Err(Error::invalid("give --preset ID, --url URL or --spec JSON"));
        };
        let layout = (!self.skill_roots.is_empty() || self.not_recursive || self.plugin_manifest)
            .then(|| LayoutSpec {
                skill_roots: (!self.skill_roots.is_empty()).then(|| self.skill_roots.clone()),
                recursive: self.not_recursive.then_some(false),
                plugin_manifest: self.plugin_manifest.then_some(true),
            });
        let skills = (!self.include.is_empty() || !self.exclude.is_empty()).then(|| SkillFilter {
            include: self.include.clone(),
            exclude: self.exclude.clone(),
            validation: None,
        });
        Ok(ToolkitSpec::Git(GitSpec {
            instance_id: self.instance_id.clone().unwrap_or_default(),
            url: url.clone(),
            git_ref: self.git_ref.clone(),
            scope,
            subdirectory: self.subdirectory.clone(),
            layout,
            skills,
        }))
    }
}

fn json_out(value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::internal(e.to_string()))?;
    println!("{text}");
    Ok(())
}

pub fn run(store: &Store, cmd: ToolkitCommand) -> Result<u8> {
    match cmd {
        ToolkitCommand::Add(args) => {
            let provisioner = Provisioner::from_env(store.clone())?;
            let toolkit = args.spec()?.resolve(provisioner.hosts())?;
            let bar = super::progress::Bar::new("toolkit add");
            let observer = Observer::default();
            let acquired = bar.watching(&observer, || {
                provisioner.acquire_observed(&toolkit, &observer)
            })?;
            bar.finish(format!("{} bytes fetched", observer.bytes()));
            if args.json {
                json_out(&acquired)?;
            } else {
                let r = &acquired.record;
                println!(
                    "{} {} at {} ({})",
                    if acquired.warm {
                        "warm start:"
                    } else {
                        "acquired"
                    },
                    r.instance_id,
                    r.key.commit,
                    r.requested
                );
                println!("  bundle   {}", r.bundle);
                println!("  manifest {}", r.manifest);
                println!("  skills   {}", r.skills);
                println!(
                    "  source   {} (fetched from {}, {})",
                    r.key.url, r.fetched_url, r.object_format
                );
                println!("  mode     {}, {} ms", acquired.mode, acquired.millis);
                // A warm start never asked the engine; its warnings belong to fetches.
                if let Some(sandbox) = (!acquired.warm).then(|| provisioner.sandbox()).flatten() {
                    for w in &sandbox.warnings {
                        println!("  warning  {w}");
                    }
                }
                if let Some(preset) = r.preset.as_deref().and_then(presets::find) {
                    if preset.tested_commit != r.key.commit {
                        println!("  note     preset last tested at {}", preset.tested_commit);
                    }
                }
                for w in &r.warnings {
                    println!("  warning  {w}");
                }
            }
            Ok(0)
        }
        ToolkitCommand::List { json } => {
            let records = BundleIndex::open(store).list()?;
            if json {
                json_out(&records)?;
            } else if records.is_empty() {
                println!("no bundles yet: `cloud-harness toolkit add` acquires one");
            } else {
                println!(
                    "{:<24} {:<19} {:>6}  {:<12}  SOURCE",
                    "TOOLKIT", "BUNDLE", "SKILLS", "COMMIT"
                );
                for r in records {
                    println!(
                        "{:<24} {:<19} {:>6}  {:<12}  {} ({})",
                        r.instance_id,
                        short(&r.bundle),
                        r.skills,
                        &r.key.commit[..12.min(r.key.commit.len())],
                        r.key.url,
                        r.requested
                    );
                }
            }
            Ok(0)
        }
        ToolkitCommand::Presets { json } => {
            if json {
                json_out(&presets::all())?;
            } else {
                for p in presets::all() {
                    println!("{:<20} {} — {}", p.id, p.name, p.description);
                    println!("{:<20} {} (last tested at {})", "", p.url, p.tested_commit);
                }
            }
            Ok(0)
        }
    }
}
