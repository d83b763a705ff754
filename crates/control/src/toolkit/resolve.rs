//! A spec's validation against the host policy and the registry: presets to their pins or
//! labels (a label's canary for an open's seed), git toolkits to exact commits, a request's
//! specs together. Every violation is an INVALID_ARGUMENT or FORBIDDEN error whose details name
//! the field.

use super::spec::{is_hex_commit, Revision, Toolkit, ToolkitSpec, MAX_TOOLKITS};
use crate::hosts::HostPolicy;
use crate::input::max_items;
use crate::presets::registry::Registry;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_skills::discovery::Layout;
use cloud_harness_skills::relpath;
use std::collections::HashSet;

impl ToolkitSpec {
    /// Validates the spec against the host policy and resolves presets from the shipped
    /// registry, unpinned (a preset without a version is the default branch head).
    pub fn resolve(&self, hosts: &HostPolicy) -> Result<Toolkit> {
        self.resolve_in(hosts, Registry::shipped())
    }

    /// The same, presets resolved in `registry`: one without a version is its entry's pin;
    /// one with a label, the label's commit (never its canary's: see [`Self::resolve_seeded`]).
    pub fn resolve_in(&self, hosts: &HostPolicy, registry: &Registry) -> Result<Toolkit> {
        self.resolve_seeded(hosts, registry, None)
    }

    /// The same for an open: a label with a canary gives its canary's commit when `seed` (the
    /// open's owner and idempotency key) falls in the canary's share.
    pub fn resolve_seeded(
        &self,
        hosts: &HostPolicy,
        registry: &Registry,
        seed: Option<&str>,
    ) -> Result<Toolkit> {
        self.check_sizes()?;
        match self {
            ToolkitSpec::Set(s) => Err(Error::field(
                Code::InvalidArgument,
                "kind",
                format!(
                    "set {:?} is one toolkit of workspace_open, expanded into its members there",
                    s.id
                ),
            )),
            ToolkitSpec::Preset(p) => {
                let entry = registry.find(&p.id).ok_or_else(|| {
                    Error::field(
                        Code::InvalidArgument,
                        "id",
                        format!(
                            "unknown preset {:?} (known: {})",
                            p.id,
                            registry.ids().join(", ")
                        ),
                    )
                })?;
                let preset = &entry.preset;
                let mut label = None;
                let revision = match p.version.as_deref() {
                    None if p.label.is_some() => {
                        let name = p.label.as_deref().unwrap_or_default();
                        let point = entry.labels.get(name).ok_or_else(|| {
                            let known: Vec<&str> =
                                entry.labels.keys().map(String::as_str).collect();
                            Error::field(
                                Code::InvalidArgument,
                                "label",
                                format!(
                                    "{} has no label {name:?} (its labels: {})",
                                    preset.id,
                                    if known.is_empty() {
                                        "none".to_owned()
                                    } else {
                                        known.join(", ")
                                    }
                                ),
                            )
                        })?;
                        let (commit, taken) =
                            point.pick(&format!("registry:{}", preset.id), name, seed);
                        label = Some(taken);
                        Revision::Commit(commit.to_owned())
                    }
                    None => match &entry.pin {
                        Some(pin) => Revision::Commit(pin.commit.clone()),
                        None => Revision::DefaultHead,
                    },
                    Some(v) if is_hex_commit(v) => Revision::Commit(v.to_owned()),
                    Some(v) => {
                        let valid = gix_validate::reference::name_partial(v.into()).is_ok()
                            && !v.starts_with('-');
                        if !valid {
                            return Err(Error::field(
                                Code::InvalidArgument,
                                "version",
                                format!("{v:?} is neither a commit id nor a valid tag name"),
                            ));
                        }
                        Revision::Tag(v.to_owned())
                    }
                };
                hosts.check(&preset.url, "url")?;
                let allowed = |c: &String| matches!(&revision, Revision::Commit(r) if r.eq_ignore_ascii_case(c));
                let allow_unreachable = entry
                    .allow_unreachable
                    .as_ref()
                    .filter(|c| allowed(c))
                    .map(|_| format!("registry:{}", preset.id));
                Ok(Toolkit {
                    instance_id: p.id.replace('/', "-"),
                    preset: Some(preset.id.clone()),
                    url: preset.url.clone(),
                    revision,
                    subdirectory: String::new(),
                    layout: Layout {
                        validation: entry.validation,
                        ..preset.layout.clone()
                    },
                    plugin_manifest: false,
                    scope: p.scope.unwrap_or(preset.default_scope),
                    session_start_skill: preset.session_start_skill.clone(),
                    allow_unreachable,
                    label,
                })
            }
            ToolkitSpec::Git(g) => {
                check_instance_id(&g.instance_id)?;
                hosts.check(&g.url, "url")?;
                let revision = match &g.git_ref {
                    Some(r) => check_ref("ref", r)?,
                    None => Revision::DefaultHead,
                };
                let subdirectory = check_subdirectory(g.subdirectory.as_deref().unwrap_or(""))?;
                let defaults = Layout::default();
                let spec_layout = g.layout.clone().unwrap_or_default();
                let filter = g.skills.clone().unwrap_or_default();
                let layout = Layout {
                    skill_roots: spec_layout
                        .skill_roots
                        .clone()
                        .unwrap_or(defaults.skill_roots),
                    recursive: spec_layout.recursive.unwrap_or(defaults.recursive),
                    include: filter.include,
                    exclude: filter.exclude,
                    validation: filter.validation.unwrap_or_default(),
                };
                layout.validate()?;
                Ok(Toolkit {
                    instance_id: g.instance_id.clone(),
                    preset: None,
                    url: g.url.clone(),
                    revision,
                    subdirectory,
                    layout,
                    plugin_manifest: spec_layout.plugin_manifest.unwrap_or(false),
                    scope: g.scope.unwrap_or_default(),
                    session_start_skill: None,
                    allow_unreachable: None,
                    label: None,
                })
            }
        }
    }
}

/// Places an error about one spec inside a request: its field becomes `toolkits[i].<field>`.
pub fn in_request(mut e: Error, i: usize) -> Error {
    let field = e.details["field"].as_str().unwrap_or("toolkit").to_owned();
    let full = format!("toolkits[{i}].{field}");
    if let Some(rest) = e.message.strip_prefix(&format!("{field}: ")) {
        e.message = format!("{full}: {rest}");
    }
    e.details["field"] = full.into();
    e
}

/// Validates every spec of a request; field names carry the index (`toolkits[1].url`), and
/// instance ids must be unique. Presets from the shipped registry, unpinned.
pub fn resolve_request(specs: &[ToolkitSpec], hosts: &HostPolicy) -> Result<Vec<Toolkit>> {
    resolve_request_in(specs, hosts, Registry::shipped())
}

/// The same, presets resolved in `registry`.
pub fn resolve_request_in(
    specs: &[ToolkitSpec],
    hosts: &HostPolicy,
    registry: &Registry,
) -> Result<Vec<Toolkit>> {
    resolve_request_seeded(specs, hosts, registry, None)
}

/// The same for an open whose owner and idempotency key are `seed` (labels' canaries).
pub fn resolve_request_seeded(
    specs: &[ToolkitSpec],
    hosts: &HostPolicy,
    registry: &Registry,
    seed: Option<&str>,
) -> Result<Vec<Toolkit>> {
    max_items("toolkits", specs.len(), MAX_TOOLKITS)?;
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let toolkit = spec
            .resolve_seeded(hosts, registry, seed)
            .map_err(|e| in_request(e, i))?;
        if !seen.insert(toolkit.instance_id.clone()) {
            let field = format!("toolkits[{i}].instanceId");
            return Err(Error::field(
                Code::InvalidArgument,
                &field,
                format!("{:?} is used twice in this request", toolkit.instance_id),
            ));
        }
        out.push(toolkit);
    }
    Ok(out)
}

fn check_instance_id(id: &str) -> Result<()> {
    let ok = (1..=80).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::field(
            Code::InvalidArgument,
            "instanceId",
            format!("{id:?} must be 1-80 letters, digits, `-` or `_`"),
        ))
    }
}

fn check_ref(field: &str, r: &str) -> Result<Revision> {
    if is_hex_commit(r) {
        return Ok(Revision::Commit(r.to_owned()));
    }
    Err(Error::field(
        Code::InvalidArgument,
        field,
        format!("{r:?} is not an exact commit id (40 or 64 lowercase hex digits); branch names move and are refused"),
    ))
}

/// A relative path inside the repository, normalized to `a/b`.
fn check_subdirectory(sub: &str) -> Result<String> {
    Ok(relpath::segments(sub, "subdirectory", "the repository")?.join("/"))
}
