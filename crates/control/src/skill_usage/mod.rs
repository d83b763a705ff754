//! Skill usage seen where skills are served: `skills_read`, `skills_run` (with its result and
//! duration), `skill://` resource reads and the first load of a file through a workspace's
//! mount. Each use is counted in memory, keyed by what it was (workspace, principal, toolkit,
//! commit, bundle, tier, skill, file, source), and a flush ([`stored`]) writes what was
//! counted to the state database every few seconds: the serving paths never wait on a
//! database. The tally is bounded ([`MAX_KEYS`], a share of them per principal, each field's
//! length): a use past the bounds is counted as dropped, never allocated for.
//!
//! Per toolkit (never per file: a bounded set of series), the uses since the process started
//! are also Prometheus counters (`cloud_harness_skill_uses`).

pub mod flush;
pub mod report;
pub mod spans;
pub mod stored;
#[cfg(test)]
mod tests;

use foldhash::HashMap;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

/// Distinct uses held between two flushes.
pub const MAX_KEYS: usize = 16_384;
/// What one principal's uses may hold of them: a client reading every file it can find (or
/// a few such clients) does not crowd the others out.
pub const MAX_KEYS_PER_PRINCIPAL: usize = MAX_KEYS / 16;
/// The longest field kept (a longer one is cut, on a character boundary).
pub const MAX_FIELD: usize = 512;
/// Toolkits with series of their own; the others are counted as `(other)`.
pub const MAX_TOOLKIT_SERIES: usize = 256;

/// Where a use was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// `skills_read`.
    Read,
    /// `skills_run`.
    Run,
    /// `resources/read` of a `skill://` URI.
    Resource,
    /// A file's content loaded through the workspace's mount (by the agent, or a script in
    /// the executor): its first read at offset 0 that the kernel's cache could not answer.
    Mount,
}

impl Source {
    pub const ALL: [Source; 4] = [Source::Read, Source::Run, Source::Resource, Source::Mount];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Read => "read",
            Source::Run => "run",
            Source::Resource => "resource",
            Source::Mount => "mount",
        }
    }

    pub fn parse(s: &str) -> Option<Source> {
        Source::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

/// A served skill as a use names it: where it comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// The toolkit's repository URL; a source without one by its name (`cloud-harness`, the
    /// built-in tier), else `project` (a project's own folder).
    pub toolkit: String,
    pub commit: String,
    /// The bundle's digest (the source tree's), `sha256:…`.
    pub bundle: String,
    pub tier: String,
}

/// One use.
#[derive(Debug, Clone, Copy)]
pub struct Use<'a> {
    pub source: Source,
    pub workspace: &'a str,
    pub principal: &'a str,
    pub origin: &'a Origin,
    pub skill: &'a str,
    /// The file inside the skill; for a run, its script.
    pub file: &'a str,
    pub failed: bool,
    pub duration_ms: u64,
}

impl Use<'_> {
    /// What names the use, in the order a [`Key`] holds it (and a span sends it).
    pub fn fields(&self) -> [&str; 9] {
        [
            self.source.as_str(),
            self.workspace,
            self.principal,
            &self.origin.toolkit,
            &self.origin.commit,
            &self.origin.bundle,
            &self.origin.tier,
            self.skill,
            self.file,
        ]
    }
}

/// What was counted of one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub uses: u64,
    pub failures: u64,
    pub duration_ms: u64,
    /// The last use, in milliseconds since the Unix epoch: the hour and day it is counted in.
    pub last_ms: i64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.uses += other.uses;
        self.failures += other.failures;
        self.duration_ms = self.duration_ms.saturating_add(other.duration_ms);
        self.last_ms = self.last_ms.max(other.last_ms);
    }
}

/// A use's key, its fields in [`Use::fields`] order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub source: Source,
    pub workspace: String,
    pub principal: String,
    pub toolkit: String,
    pub commit: String,
    pub bundle: String,
    pub tier: String,
    pub skill: String,
    pub file: String,
}

/// What a flush takes: every key counted since the last one.
pub type Batch = Vec<(Key, Tally)>;

#[derive(Default)]
struct Counts {
    /// By key, its fields joined by NUL (none has one): a use already counted is found
    /// without allocating, in one lookup.
    keys: HashMap<String, Counted>,
    per_principal: HashMap<String, usize>,
    /// Each toolkit's slot in `series`, for at most [`MAX_TOOLKIT_SERIES`] of them.
    slots: HashMap<String, usize>,
    /// Since the process started, by toolkit (or `(other)`) and then by source:
    /// (uses, failures).
    series: Vec<(String, [(u64, u64); 4])>,
}

/// The series of the toolkits past [`MAX_TOOLKIT_SERIES`] (no toolkit's URL or name).
const OTHER: &str = "(other)";

struct Counted {
    key: Key,
    tally: Tally,
    /// Its toolkit's slot in `Counts::series`.
    slot: usize,
}

struct Usage {
    counts: Mutex<Counts>,
    dropped: AtomicU64,
    off: AtomicBool,
}

static USAGE: LazyLock<Usage> = LazyLock::new(|| Usage {
    counts: Mutex::new(Counts::default()),
    dropped: AtomicU64::new(0),
    off: AtomicBool::new(false),
});

/// The tally, whatever a panic elsewhere left it in (a count, at worst, half made).
fn counts() -> std::sync::MutexGuard<'static, Counts> {
    USAGE
        .counts
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Turns counting off (`usage = "off"`) or on again.
pub fn set_enabled(on: bool) {
    USAGE.off.store(!on, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    !USAGE.off.load(Ordering::Relaxed)
}

/// Uses not counted because the tally was full (or the database refused them too long),
/// since the process started.
pub fn dropped() -> u64 {
    USAGE.dropped.load(Ordering::Relaxed)
}

/// Gives up `batch`'s uses, counted as dropped.
pub fn drop_batch(batch: &Batch) {
    let uses: u64 = batch.iter().map(|(_, t)| t.uses).sum();
    USAGE.dropped.fetch_add(uses, Ordering::Relaxed);
}

/// `s` as a use records it: cut to at most [`MAX_FIELD`] bytes, without NUL (the usage
/// view names a library's skill this way to find its uses).
pub fn field(s: &str) -> &str {
    let s = s.split('\0').next().unwrap_or_default();
    if s.len() <= MAX_FIELD {
        return s;
    }
    let mut end = MAX_FIELD;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Counts one use.
pub fn record(u: &Use) {
    if !enabled() {
        return;
    }
    let now = crate::state::now_ms();
    let one = Tally {
        uses: 1,
        failures: u64::from(u.failed),
        duration_ms: u.duration_ms,
        last_ms: now,
    };
    let fields = u.fields();
    thread_local! {
        static JOINED: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    JOINED.with_borrow_mut(|joined| {
        joined.clear();
        join_into(joined, fields);
        let mut counts = counts();
        if let Some(c) = counts.keys.get_mut(joined.as_str()) {
            c.tally.add(&one);
            let slot = c.slot;
            counts.count_series(slot, u.source, &one);
            return;
        }
        let slot = counts.slot(field(&u.origin.toolkit));
        counts.count_series(slot, u.source, &one);
        // Admitted before anything is allocated for it.
        if !counts.admit(field(u.principal)) {
            USAGE.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let key = Key {
            source: u.source,
            workspace: field(u.workspace).to_owned(),
            principal: field(u.principal).to_owned(),
            toolkit: field(&u.origin.toolkit).to_owned(),
            commit: field(&u.origin.commit).to_owned(),
            bundle: field(&u.origin.bundle).to_owned(),
            tier: field(&u.origin.tier).to_owned(),
            skill: field(u.skill).to_owned(),
            file: field(u.file).to_owned(),
        };
        let tally = one;
        counts
            .keys
            .insert(joined.clone(), Counted { key, tally, slot });
    });
}

impl Counts {
    /// Whether a new key of `principal` fits.
    fn admit(&mut self, principal: &str) -> bool {
        if self.keys.len() >= MAX_KEYS {
            return false;
        }
        let mine = self.per_principal.get(principal).copied().unwrap_or(0);
        if mine >= MAX_KEYS_PER_PRINCIPAL {
            return false;
        }
        *self.per_principal.entry(principal.to_owned()).or_default() = mine + 1;
        true
    }

    /// The series slot of `toolkit`: its own while fewer than [`MAX_TOOLKIT_SERIES`] have
    /// one, else `(other)`'s.
    fn slot(&mut self, toolkit: &str) -> usize {
        if let Some(&slot) = self.slots.get(toolkit) {
            return slot;
        }
        let (name, mine) = match self.slots.len() < MAX_TOOLKIT_SERIES {
            true => (toolkit, true),
            false => (OTHER, false),
        };
        if !mine {
            if let Some(other) = self.series.iter().position(|(n, _)| n == OTHER) {
                return other;
            }
        }
        self.series.push((name.to_owned(), Default::default()));
        let slot = self.series.len() - 1;
        if mine {
            self.slots.insert(toolkit.to_owned(), slot);
        }
        slot
    }

    fn count_series(&mut self, slot: usize, source: Source, one: &Tally) {
        let (uses, failures) = &mut self.series[slot].1[source as usize];
        *uses += one.uses;
        *failures += one.failures;
    }
}

/// Everything counted since the last take, the tally emptied.
pub fn take() -> Batch {
    let mut counts = counts();
    counts.per_principal.clear();
    std::mem::take(&mut counts.keys)
        .into_values()
        .map(|c| (c.key, c.tally))
        .collect()
}

/// Puts back what a flush could not write (the database was away): merged with what was
/// counted since, within the same bounds; the rest counted as dropped.
pub fn put_back(batch: Batch) {
    if batch.is_empty() {
        return;
    }
    let mut counts = counts();
    for (key, tally) in batch {
        let joined = joined(&key);
        if let Some(c) = counts.keys.get_mut(&joined) {
            c.tally.add(&tally);
        } else if counts.admit(&key.principal) {
            let slot = counts.slot(&key.toolkit);
            counts.keys.insert(joined, Counted { key, tally, slot });
        } else {
            USAGE.dropped.fetch_add(tally.uses, Ordering::Relaxed);
        }
    }
}

fn joined(key: &Key) -> String {
    let mut s = String::new();
    let fields = [
        key.source.as_str(),
        &key.workspace,
        &key.principal,
        &key.toolkit,
        &key.commit,
        &key.bundle,
        &key.tier,
        &key.skill,
        &key.file,
    ];
    join_into(&mut s, fields);
    s
}

/// A key's fields, each cut to its bound, joined by NUL: its place in the tally.
fn join_into(out: &mut String, fields: [&str; 9]) {
    for f in fields {
        out.push_str(field(f));
        out.push('\0');
    }
}

/// Keys held now (for tests and the bound's checks).
pub fn held() -> usize {
    counts().keys.len()
}

/// `value` as the text format writes a label's value (the encoder writes it as it is): a
/// toolkit named by a client cannot close its quotes and add a series of its own.
fn label(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .into()
}

/// The Prometheus series: uses and run failures per toolkit and source since the process
/// started, and the uses dropped.
#[derive(Debug)]
pub struct Series;

impl Collector for Series {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let series: Vec<((String, Source), (u64, u64))> = {
            let counts = counts();
            let mut s: Vec<_> = counts
                .series
                .iter()
                .flat_map(|(toolkit, by)| {
                    Source::ALL
                        .into_iter()
                        .filter(|s| by[*s as usize].0 > 0)
                        .map(|s| ((toolkit.clone(), s), by[s as usize]))
                })
                .collect();
            s.sort_by(|a, b| (&a.0 .0, a.0 .1.as_str()).cmp(&(&b.0 .0, b.0 .1.as_str())));
            s
        };
        let mut uses = encoder.encode_descriptor(
            "cloud_harness_skill_uses",
            "Skill uses seen where skills are served, by toolkit and source (read, run, resource, mount)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for ((toolkit, source), (n, _)) in &series {
            let labels = [
                ("toolkit", label(toolkit)),
                ("source", source.as_str().into()),
            ];
            ConstCounter::new(*n).encode(uses.encode_family(&labels)?)?;
        }
        let mut failed = encoder.encode_descriptor(
            "cloud_harness_skill_run_failures",
            "skills_run calls whose script ran and did not exit with 0 (an exit code, a signal, a timeout, a limit), by toolkit",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for ((toolkit, source), (_, f)) in &series {
            if *source == Source::Run {
                let labels = [("toolkit", label(toolkit))];
                ConstCounter::new(*f).encode(failed.encode_family(&labels)?)?;
            }
        }
        let dropped = ConstCounter::new(dropped());
        dropped.encode(encoder.encode_descriptor(
            "cloud_harness_skill_uses_dropped",
            "Skill uses not counted: the in-memory tally was full between two flushes, or the database refused them for a minute",
            None,
            dropped.metric_type(),
        )?)?;
        Ok(())
    }
}
