//! Every setting the harness has: its key in the configuration file, the environment variable
//! it stands for, what kind of value it takes and its default, in one table.

/// What a setting's value is.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Text,
    Path,
    /// A whole number (a count, bytes or seconds).
    Number,
    /// Strings, written as an array (the variable joins them with commas).
    List,
    /// One of these words.
    Choice(&'static [&'static str]),
}

#[derive(Debug)]
pub struct Setting {
    /// The key in the file, dotted by table: `http.max_connections`.
    pub key: &'static str,
    pub env: &'static str,
    pub kind: Kind,
    /// The default, as people read it.
    pub default: &'static str,
}

const fn s(key: &'static str, env: &'static str, kind: Kind, default: &'static str) -> Setting {
    Setting {
        key,
        env,
        kind,
        default,
    }
}

/// Every setting, in the order `config check` prints them.
pub(crate) const SETTINGS: &[Setting] = &[
    s(
        "home",
        "CLOUD_HARNESS_HOME",
        Kind::Path,
        "$XDG_DATA_HOME/cloud-harness, else ~/.local/share/cloud-harness",
    ),
    s(
        "store",
        "TOOLKIT_CACHE_ROOT",
        Kind::Path,
        "$XDG_CACHE_HOME/cloud-harness/store, else ~/.cache/cloud-harness/store",
    ),
    s(
        "store.max_bytes",
        "TOOLKIT_CACHE_MAX_BYTES",
        Kind::Number,
        "none",
    ),
    s(
        "database",
        "CLOUD_HARNESS_DATABASE_URL",
        Kind::Text,
        "SQLite at <home>/state.db",
    ),
    s(
        "runner",
        "CLOUD_HARNESS_RUNNER",
        Kind::Text,
        "the host name and a random suffix, kept in <home>/runner-id",
    ),
    s("store.remote", "TOOLKIT_STORE_URL", Kind::Text, "none"),
    s(
        "store.packs",
        "TOOLKIT_STORE_PACKS",
        Kind::Choice(&["true", "false"]),
        "true",
    ),
    s("store.endpoint", "AWS_ENDPOINT_URL", Kind::Text, "AWS S3"),
    s("store.region", "AWS_REGION", Kind::Text, "us-east-1"),
    s(
        "store.allow_http",
        "AWS_ALLOW_HTTP",
        Kind::Choice(&["true", "false"]),
        "false",
    ),
    s(
        "log.filter",
        "RUST_LOG",
        Kind::Text,
        "warn,rmcp::service=error",
    ),
    s(
        "git.allowed_hosts",
        "ALLOWED_GIT_HOSTS",
        Kind::List,
        "github.com",
    ),
    s(
        "git.url_rewrite",
        "CLOUD_HARNESS_URL_REWRITE",
        Kind::List,
        "none",
    ),
    s("git.extra_ca", "CLOUD_HARNESS_EXTRA_CA", Kind::Path, "none"),
    s(
        "git.head_ttl",
        "CLOUD_HARNESS_HEAD_TTL",
        Kind::Number,
        "600",
    ),
    s(
        "egress.proxy",
        "HTTPS_PROXY",
        Kind::Text,
        "the built-in egress proxy on loopback",
    ),
    s(
        "egress.allow_cidrs",
        "CLOUD_HARNESS_ALLOW_CIDRS",
        Kind::List,
        "none",
    ),
    s(
        "egress.resolve",
        "CLOUD_HARNESS_RESOLVE",
        Kind::List,
        "none",
    ),
    s(
        "fetch.containers",
        "CLOUD_HARNESS_CONTAINERS",
        Kind::Choice(&["auto", "off"]),
        "auto: helper containers when an engine answers",
    ),
    s(
        "fetch.standby_helpers",
        "CLOUD_HARNESS_STANDBY_HELPERS",
        Kind::Number,
        "2",
    ),
    s(
        "fetch.max_files",
        "CLOUD_HARNESS_MAX_FILES",
        Kind::Number,
        "20000",
    ),
    s(
        "fetch.max_bytes",
        "CLOUD_HARNESS_MAX_BYTES",
        Kind::Number,
        "268435456",
    ),
    s(
        "fetch.max_file_bytes",
        "CLOUD_HARNESS_MAX_FILE_BYTES",
        Kind::Number,
        "33554432",
    ),
    s(
        "fetch.max_depth",
        "CLOUD_HARNESS_MAX_DEPTH",
        Kind::Number,
        "32",
    ),
    s(
        "fetch.timeout",
        "CLOUD_HARNESS_FETCH_TIMEOUT",
        Kind::Number,
        "120",
    ),
    s(
        "project.max_bytes",
        "CLOUD_HARNESS_PROJECT_MAX_BYTES",
        Kind::Number,
        "2147483648",
    ),
    s(
        "project.max_files",
        "CLOUD_HARNESS_PROJECT_MAX_FILES",
        Kind::Number,
        "200000",
    ),
    s(
        "project.max_watches",
        "CLOUD_HARNESS_PROJECT_MAX_WATCHES",
        Kind::Number,
        "1024",
    ),
    s(
        "project.max_watches_total",
        "CLOUD_HARNESS_PROJECT_MAX_WATCHES_TOTAL",
        Kind::Number,
        "half of fs.inotify.max_user_watches, at most 65536",
    ),
    s(
        "disk.min_free_mib",
        "CLOUD_HARNESS_MIN_FREE_MIB",
        Kind::Number,
        "256",
    ),
    s(
        "workspace.restore_timeout",
        "CLOUD_HARNESS_RESTORE_TIMEOUT",
        Kind::Number,
        "30",
    ),
    s(
        "trust.policy",
        "CLOUD_HARNESS_TRUST_POLICY",
        Kind::Path,
        "none: no signature is checked",
    ),
    s(
        "usage.counting",
        "CLOUD_HARNESS_USAGE",
        Kind::Choice(&["on", "off"]),
        "on",
    ),
    s(
        "usage.flush_seconds",
        "CLOUD_HARNESS_USAGE_FLUSH_SECONDS",
        Kind::Number,
        "10",
    ),
    s(
        "usage.retention_days",
        "CLOUD_HARNESS_USAGE_RETENTION_DAYS",
        Kind::Number,
        "30",
    ),
    s(
        "usage.daily_retention_days",
        "CLOUD_HARNESS_USAGE_DAILY_RETENTION_DAYS",
        Kind::Number,
        "400",
    ),
    s(
        "usage.otlp_endpoint",
        "CLOUD_HARNESS_USAGE_OTLP_ENDPOINT",
        Kind::Text,
        "none: no span is sent",
    ),
    s(
        "workspace.idle_pause",
        "CLOUD_HARNESS_IDLE_PAUSE",
        Kind::Number,
        "600",
    ),
    s(
        "executor.kind",
        "CLOUD_HARNESS_EXECUTOR",
        Kind::Choice(&["auto", "docker", "bwrap", "host", "none"]),
        "auto: docker, else bwrap, else none",
    ),
    s(
        "executor.image",
        "CLOUD_HARNESS_EXECUTOR_IMAGE",
        Kind::Text,
        "the harness's own image",
    ),
    s(
        "executor.network",
        "CLOUD_HARNESS_EXECUTOR_NETWORK",
        Kind::Choice(&["none", "egress"]),
        "none",
    ),
    s(
        "executor.allowed_hosts",
        "CLOUD_HARNESS_EXECUTOR_ALLOWED_HOSTS",
        Kind::List,
        "none",
    ),
    s(
        "executor.uid",
        "CLOUD_HARNESS_EXECUTOR_UID",
        Kind::Number,
        "10001",
    ),
    s(
        "executor.spares",
        "CLOUD_HARNESS_EXECUTOR_SPARES",
        Kind::Number,
        "2",
    ),
    s(
        "executor.cgroup",
        "CLOUD_HARNESS_EXECUTOR_CGROUP",
        Kind::Text,
        "auto",
    ),
    s(
        "executor.without_cgroup",
        "CLOUD_HARNESS_EXECUTOR_WITHOUT_CGROUP",
        Kind::Choice(&["refuse", "allow"]),
        "refuse",
    ),
    s(
        "http.header_timeout",
        "CLOUD_HARNESS_HTTP_HEADER_TIMEOUT",
        Kind::Number,
        "10",
    ),
    s(
        "http.max_connections",
        "CLOUD_HARNESS_HTTP_MAX_CONNECTIONS",
        Kind::Number,
        "1024",
    ),
    s(
        "http.public_origin",
        "CLOUD_HARNESS_HTTP_PUBLIC_ORIGIN",
        Kind::Text,
        "none: the origin a browser reaches the server at (http://<its Host>)",
    ),
    s(
        "http.max_sessions",
        "CLOUD_HARNESS_HTTP_MAX_SESSIONS",
        Kind::Number,
        "1000",
    ),
    s(
        "http.max_sessions_per_client",
        "CLOUD_HARNESS_HTTP_MAX_SESSIONS_PER_CLIENT",
        Kind::Number,
        "none (an older name of limits.sessions, read when that is unset)",
    ),
    s(
        "http.session_idle",
        "CLOUD_HARNESS_HTTP_SESSION_IDLE",
        Kind::Number,
        "60",
    ),
    // Quotas per principal (crates/control/src/limits): the defaults are `Limits::default()`'s.
    s(
        "limits.workspaces",
        "CLOUD_HARNESS_LIMIT_WORKSPACES",
        Kind::Number,
        "256",
    ),
    s(
        "limits.sessions",
        "CLOUD_HARNESS_LIMIT_SESSIONS",
        Kind::Number,
        "100",
    ),
    s(
        "limits.runs",
        "CLOUD_HARNESS_LIMIT_RUNS",
        Kind::Number,
        "16",
    ),
    s(
        "limits.queued_runs",
        "CLOUD_HARNESS_LIMIT_QUEUED_RUNS",
        Kind::Number,
        "64",
    ),
    s(
        "limits.run_cpu_seconds",
        "CLOUD_HARNESS_LIMIT_RUN_CPU_SECONDS",
        Kind::Number,
        "600",
    ),
    s(
        "limits.run_memory",
        "CLOUD_HARNESS_LIMIT_RUN_MEMORY",
        Kind::Number,
        "4294967296",
    ),
    s(
        "limits.run_output",
        "CLOUD_HARNESS_LIMIT_RUN_OUTPUT",
        Kind::Number,
        "262144",
    ),
    s(
        "limits.acquisitions_per_hour",
        "CLOUD_HARNESS_LIMIT_ACQUISITIONS_PER_HOUR",
        Kind::Number,
        "600",
    ),
    s(
        "limits.imports_per_hour",
        "CLOUD_HARNESS_LIMIT_IMPORTS_PER_HOUR",
        Kind::Number,
        "120",
    ),
    s(
        "limits.requests_per_second",
        "CLOUD_HARNESS_LIMIT_REQUESTS_PER_SECOND",
        Kind::Number,
        "1000",
    ),
    s(
        "limits.requests_in_flight",
        "CLOUD_HARNESS_LIMIT_REQUESTS_IN_FLIGHT",
        Kind::Number,
        "256",
    ),
    s(
        "limits.blocking",
        "CLOUD_HARNESS_LIMIT_BLOCKING",
        Kind::Number,
        "64",
    ),
    s(
        "limits.request_millis",
        "CLOUD_HARNESS_LIMIT_REQUEST_MILLIS",
        Kind::Number,
        "2000",
    ),
];
