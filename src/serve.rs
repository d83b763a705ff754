//! `cloud-harness serve`: the MCP server over stdio (default) or Streamable HTTP.

use clap::Args;
use cloud_harness_control::home;
use cloud_harness_control::skill_usage::flush::Flusher;
use cloud_harness_error::{Error, Result};
use cloud_harness_mcp::HarnessServer;
use cloud_harness_provision::Provisioner;
use cloud_harness_store::cas::Store;
use cloud_harness_workspace::Workspaces;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Serve Streamable HTTP at ADDR (path /mcp) instead of stdio; without ADDR, loopback
    /// port 8765.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:8765")]
    pub http: Option<SocketAddr>,
    /// An extra browser origin allowed to call the HTTP endpoint (repeatable); loopback
    /// origins are always allowed, any other Origin gets 403.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
    /// Where workspaces and operator decisions live.
    #[arg(long, env = "CLOUD_HARNESS_HOME", value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Do not mount skills file systems (skills_read and skills_run still work).
    #[arg(long)]
    pub no_mount: bool,
    /// How HTTP callers are checked: `token` (bearer tokens and browser sessions), or `none`
    /// (everyone is the operator; accepted on a loopback address only).
    #[arg(long, value_enum, default_value_t = AuthMode::Token)]
    pub auth: AuthMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    Token,
    None,
}

pub fn run(store: &Store, args: &ServeArgs) -> Result<u8> {
    if let (Some(addr), AuthMode::None) = (args.http, args.auth) {
        if !addr.ip().is_loopback() {
            return Err(Error::field(
                cloud_harness_error::Code::InvalidArgument,
                "auth",
                format!("--auth none serves anyone who reaches {addr}: it is accepted on a loopback address only"),
            ));
        }
        tracing::warn!(%addr, "--auth none: every local process may call as the operator");
    }
    // What the server writes for executors (approved copies, identity files) must be readable
    // by their unprivileged user, whatever umask the server was started with.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    // Room for the connection cap besides the store's and the mounts' descriptors.
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
    let home = args.home.clone().unwrap_or_else(home::default_home);
    // The quotas, read now: a limit that is not a number stops the start, not a request.
    let limits = cloud_harness_control::limits::Limits::from_env()?;
    tracing::info!(?limits, "limits per principal");
    // Checked before anything is restored or bound.
    let public_origin = public_origin()?;
    // Before the restored workspaces mount: whether their loads are counted.
    let usage = cloud_harness_control::skill_usage::flush::Settings::from_env()?;
    cloud_harness_control::skill_usage::set_enabled(usage.counting);
    // Each use as a span too, where a collector is named (a use is seen only when counted).
    use cloud_harness_control::skill_usage::spans;
    let exporter = match spans::endpoint_from_env() {
        Some(endpoint) if usage.counting => Some(spans::Exporter::start(&endpoint)?),
        Some(_) => {
            tracing::warn!("usage.otlp_endpoint is set but usage counting is off: no span is sent");
            None
        }
        None => None,
    };
    let provisioner = Provisioner::from_env(store.clone())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(cloud_harness_control::limits::BLOCKING_THREADS)
        .build()
        .map_err(|e| Error::internal(format!("starting the runtime: {e}")))?;
    // Its workers give back what they hold free when the server asks (memory::idle).
    cloud_harness_memory::idle::answered_by(runtime.handle());
    let mounting = !args.no_mount;
    let workspaces = Arc::new(runtime.block_on(async {
        let home = home.clone();
        tokio::task::spawn_blocking(move || Workspaces::new(home, provisioner, mounting))
            .await
            .map_err(|e| Error::internal(e.to_string()))?
    })?);
    // The engine's warnings (an engine with CVE-2024-29018, say) are said once, at start-up,
    // in the log; results carry them only under `provisioning`. Asked in the background, so
    // neither the start nor a warm open waits for the engine.
    // With helper containers, the provisioning network, its proxy and the helpers on standby
    // are made then too, so the first cold open waits for none of them.
    let standby = cloud_harness_control::config::env_number("CLOUD_HARNESS_STANDBY_HELPERS", 2)?;
    {
        let workspaces = workspaces.clone();
        std::thread::spawn(move || {
            workspaces.provisioning();
            workspaces.provisioner().keep_warm(standby as usize);
        });
    }
    if let Some(remote) = workspaces.provisioner().remote() {
        tracing::info!(
            store = remote.url(),
            "bundles are shared through the store of record"
        );
        retry_publications(workspaces.clone());
    }
    if let Some(max) = cloud_harness_provision::cache::max_bytes_from_env()? {
        keep_within(store.clone(), max);
    }
    let idle = cloud_harness_control::config::env_number(
        "CLOUD_HARNESS_IDLE_PAUSE",
        cloud_harness_workspace::pause::IDLE.as_secs(),
    )?;
    pause_when_idle(
        workspaces.clone(),
        (idle > 0).then(|| Duration::from_secs(idle)),
    );
    let flusher = match Flusher::start(workspaces.db().clone(), usage) {
        Ok(f) => f,
        Err(e) => {
            workspaces.shutdown();
            return Err(e);
        }
    };
    // On a worker rather than this thread, which would otherwise make every connection's tasks
    // and never park (the blocks the workers free would stay on its pages: memory::idle).
    let served = {
        let (workspaces, args) = (workspaces.clone(), args.clone());
        runtime.spawn(async move { serve(workspaces, &args, public_origin).await })
    };
    let result = runtime
        .block_on(served)
        .map_err(|e| Error::internal(format!("the server's task failed: {e}")))
        .and_then(|served| served);
    // Unmount before exiting (runs are killed first); the records stay, so the next start
    // restores the workspaces.
    workspaces.shutdown();
    // After the unmounts: no load can be counted after the last flush.
    if let Some(flusher) = flusher {
        flusher.stop();
    }
    if let Some(exporter) = exporter {
        exporter.stop();
    }
    // Work still on the blocking pool (an acquisition waiting on a slow server) is not waited
    // for: what it would publish is published whole or not at all.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result.map(|()| 0)
}

/// Publications to the store of record that an outage or a killed process cut short, tried
/// again in the background for as long as the server runs.
fn retry_publications(workspaces: Arc<Workspaces>) {
    let retry = move || loop {
        match workspaces.provisioner().publish_pending() {
            Ok(pass) if pass.failed > 0 => tracing::warn!(
                published = pass.published,
                failed = pass.failed,
                "publications to the store of record are still failing; retrying"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e.message, "cannot read the publication queue"),
        }
        std::thread::sleep(cloud_harness_provision::publication::RETRY_EVERY);
    };
    let _ = std::thread::Builder::new()
        .name("publication".into())
        .spawn(retry);
}

/// Pauses workspaces unused for `idle` (none with `None`), looked for every quarter of it (at
/// most every 30 s, at least every second). Once 5 s have passed since the last pause, close
/// or open, every thread is asked to give back what the allocator holds free for it
/// (`memory::idle`) every 2 s for 15 s (blocks are freed after a close too: a session's, a
/// thread's that ends), and at least once a minute while they go on.
fn pause_when_idle(workspaces: Arc<Workspaces>, idle: Option<Duration>) {
    let every = idle.map_or(Duration::from_secs(5), |idle| {
        (idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(30))
    });
    // Memory is looked after more often than pauses: a close's should go back within
    // seconds, whatever the idle time.
    let tick = every.min(GIVE_BACK_TICK);
    let mut next_pause = Instant::now() + every;
    let mut open = 0;
    // The last pause or change in open workspaces, and the first since memory was last
    // given back.
    let mut last_change: Option<Instant> = None;
    let mut first_change: Option<Instant> = None;
    // Once more, a tick after the last ask: threads that answered at once may have found the
    // arena's purge taken by another (mimalloc skips it then), and nothing else purges an
    // idle process.
    let mut purge_after = false;
    let pause = move || loop {
        std::thread::sleep(tick);
        if std::mem::take(&mut purge_after) {
            cloud_harness_memory::allocator::give_back();
        }
        let mut paused = 0;
        if Instant::now() >= next_pause {
            paused = idle.map_or(0, |idle| workspaces.pause_idle(idle));
            next_pause = Instant::now() + every;
        }
        let now_open = workspaces.open_workspaces().len();
        // Fewer (a close) or more (an open's temporary memory) since the last look.
        if paused > 0 || now_open != open {
            last_change = Some(Instant::now());
            first_change.get_or_insert_with(Instant::now);
        }
        open = now_open;
        // Once things are quiet (memory given back during a burst of opens would be faulted
        // in again at once), or at least once a minute while they never are.
        let quiet = last_change.is_some_and(|at| at.elapsed() >= GIVE_BACK_QUIET);
        let overdue = first_change.is_some_and(|at| at.elapsed() >= GIVE_BACK_AT_LEAST);
        if quiet || overdue {
            cloud_harness_memory::idle::ask();
            first_change = None;
        }
        if last_change.is_some_and(|at| at.elapsed() >= GIVE_BACK_QUIET + GIVE_BACK_FOR) {
            last_change = None;
            purge_after = true;
        }
    };
    let _ = std::thread::Builder::new()
        .name("idle-pause".into())
        .spawn(pause);
}

/// How long after the last pause or change in open workspaces the allocator is first asked
/// to give back what it holds free.
const GIVE_BACK_QUIET: Duration = Duration::from_secs(5);

/// And for how long after that it is asked again: past the 10 s the runtime keeps an idle
/// blocking thread (what a thread that ends held goes back as its last blocks are freed).
const GIVE_BACK_FOR: Duration = Duration::from_secs(15);

/// How often memory is given back, at least, while workspaces keep changing.
const GIVE_BACK_AT_LEAST: Duration = Duration::from_secs(60);

/// How often, at most, the idle thread looks.
const GIVE_BACK_TICK: Duration = Duration::from_secs(2);

/// Keeps the local store within `TOOLKIT_CACHE_MAX_BYTES`, checked every ten minutes.
fn keep_within(store: Store, max: u64) {
    let trim = move || loop {
        match cloud_harness_provision::cache::collect(&store, Duration::from_secs(3600), Some(max)) {
            Ok(t) if t.bytes_after > Some(max) => tracing::warn!(
                bytes = t.bytes_after,
                max,
                "the store is above TOOLKIT_CACHE_MAX_BYTES, and everything left is in use or used within the hour"
            ),
            Ok(t) if !t.forgotten.is_empty() => tracing::info!(
                forgotten = ?t.forgotten,
                bytes = t.bytes_after,
                "forgot the least recently used bundles to stay within TOOLKIT_CACHE_MAX_BYTES"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e.message, "collecting the store failed"),
        }
        std::thread::sleep(Duration::from_secs(600));
    };
    let _ = std::thread::Builder::new().name("cache".into()).spawn(trim);
}

/// Where the first start leaves the first operator token (its first line) and a one-time
/// login link (its second), in the server's home: readable by the server's user alone.
pub const FIRST_TOKEN_FILE: &str = "operator-token";

/// On the first start (no token was ever made) an operator token and a one-time login link
/// for the browser, written to [`FIRST_TOKEN_FILE`] and shown on the terminal when there is
/// one; the log (a service's journal) names the file, never the secrets.
fn first_start(
    db: &cloud_harness_control::state::Db,
    bound: SocketAddr,
    home: &Path,
) -> Result<()> {
    if cloud_harness_auth::any(db)? {
        return Ok(());
    }
    const NAME: &str = "operator";
    let token = cloud_harness_auth::create(
        db,
        NAME,
        cloud_harness_auth::Role::Operator,
        "system:first-start",
    )?;
    let code = cloud_harness_auth::login_code(db, NAME, "system:first-start")?;
    let link = format!("http://{bound}/login?code={code}");
    let path = home.join(FIRST_TOKEN_FILE);
    write_secret(&path, &format!("{}\n{link}\n", token.token))?;
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        eprintln!(
            "cloud-harness: first start: made the operator token {NAME:?} (kept in {} for this user only; `cloud-harness token …` manages tokens):\n    {}\ncloud-harness: MCP clients send it as `Authorization: Bearer <token>`; open the dashboard in a browser with this one-time link (valid for a day):\n    {link}",
            path.display(),
            token.token
        );
    } else {
        eprintln!(
            "cloud-harness: first start: made the operator token {NAME:?}; it and a one-time login link for the dashboard (valid for a day) are in {} (this user only: the token on its first line, the link on its second). MCP clients send the token as `Authorization: Bearer <token>`; `cloud-harness token …` manages tokens.",
            path.display()
        );
    }
    Ok(())
}

/// Writes `text` to `path` for this user alone: a new file made with mode 0600 and O_EXCL
/// (never readable by anyone else, even for a moment), then renamed over whatever was there
/// (a file left by an earlier database, or a link: replaced, never written through).
fn write_secret(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut file = tempfile::Builder::new()
        .prefix(".operator-token.")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)
        .map_err(|e| Error::io(dir, e))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.as_file().sync_all())
        .map_err(|e| Error::io(file.path(), e))?;
    file.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// Where browsers reach the dashboard through a proxy in front
/// (`CLOUD_HARNESS_HTTP_PUBLIC_ORIGIN`, `http.public_origin`), when set.
fn public_origin() -> Result<Option<String>> {
    match std::env::var(PUBLIC_ORIGIN_VAR) {
        Ok(v) if !v.is_empty() => cloud_harness_auth::http::parse_public_origin(&v).map(Some),
        _ => Ok(None),
    }
}

pub const PUBLIC_ORIGIN_VAR: &str = "CLOUD_HARNESS_HTTP_PUBLIC_ORIGIN";

async fn serve(
    workspaces: Arc<Workspaces>,
    args: &ServeArgs,
    public_origin: Option<String>,
) -> Result<()> {
    let server = HarnessServer::new(workspaces.clone());
    let stop = CancellationToken::new();
    {
        // Handlers installed before anything is announced: a SIGTERM right after the server
        // says where it listens is a clean stop too, not the default disposition's kill.
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())
            .map_err(|e| Error::internal(format!("handling SIGTERM: {e}")))?;
        let mut interrupt = signal(SignalKind::interrupt())
            .map_err(|e| Error::internal(format!("handling SIGINT: {e}")))?;
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = interrupt.recv() => {}
            }
            stop.cancel();
        });
    }
    match args.http {
        None => {
            let (input, output, writer) =
                cloud_harness_mcp::stdio::filtered(tokio::io::stdin(), tokio::io::stdout());
            let ended = match server.serve((input, output)).await {
                Ok(service) => {
                    tokio::select! {
                        _ = service.waiting() => {}
                        _ = stop.cancelled() => {}
                    }
                    Ok(())
                }
                // The client went away before a session began (one that only asked
                // `server/discover`, as SDKs probing a server do): a normal end.
                Err(rmcp::service::ServerInitializeError::ConnectionClosed(when)) => {
                    tracing::debug!(%when, "stdio closed before a session began");
                    Ok(())
                }
                Err(e) => Err(Error::internal(format!("stdio: {e}"))),
            };
            // The last answers out before exiting.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer).await;
            ended
        }
        Some(addr) => {
            let mut origins: Vec<String> = [
                "http://localhost:*",
                "http://127.0.0.1:*",
                "http://[::1]:*",
                "https://localhost:*",
                "https://127.0.0.1:*",
                "https://[::1]:*",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            origins.extend(args.allow_origins.iter().cloned());
            let mut hosts = vec![
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
                "::1".to_owned(),
            ];
            if !addr.ip().is_loopback() {
                hosts.push(addr.ip().to_string());
                tracing::warn!(%addr, "serving MCP beyond loopback");
            }
            // Behind a proxy, browsers reach the dashboard at its public origin: its host is
            // one this server answers to, and the only origin a browser session writes from.
            if let Some(host) = public_origin
                .as_deref()
                .and_then(|o| url::Url::parse(o).ok())
                .and_then(|u| u.host_str().map(|h| h.trim_matches(['[', ']']).to_owned()))
            {
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
            let config = StreamableHttpServerConfig::default()
                .with_allowed_hosts(hosts.clone())
                .with_allowed_origins(origins.clone())
                .with_legacy_session_mode(true)
                .with_cancellation_token(stop.child_token());
            let sessions = cloud_harness_mcp::sessions::Sessions::new(
                cloud_harness_mcp::sessions::Limits::from_env()?,
            );
            let service = StreamableHttpService::new(
                move || Ok(server.for_session()),
                sessions.manager.clone(),
                config,
            );
            let db = workspaces.db().clone();
            let mode = match args.auth {
                AuthMode::Token => cloud_harness_auth::http::Mode::Tokens,
                AuthMode::None => cloud_harness_auth::http::Mode::None,
            };
            let auth = cloud_harness_auth::http::Auth::new(
                db.clone(),
                mode,
                origins.clone(),
                hosts.clone(),
                public_origin,
            );
            let api = Arc::new(cloud_harness_http::api::Api {
                workspaces: workspaces.clone(),
                imports: cloud_harness_workspace::imports::Imports::start(workspaces.clone())?,
                library: Default::default(),
            });
            let router = cloud_harness_mcp::http::router(service, sessions)
                .merge(cloud_harness_http::api::router(api.clone()))
                .merge(cloud_harness_http::dashboard::router(api))
                .merge(cloud_harness_auth::pages::router(auth.clone()))
                .merge(cloud_harness_http::health::router(workspaces.clone()))
                // Quotas count per principal: they run once the caller is known.
                .layer(axum::middleware::from_fn(cloud_harness_auth::quotas::guard))
                .layer(axum::middleware::from_fn_with_state(
                    auth,
                    cloud_harness_auth::http::guard,
                ));
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| Error::internal(format!("binding {addr}: {e}")))?;
            let bound = listener
                .local_addr()
                .map_err(|e| Error::internal(e.to_string()))?;
            let limits = cloud_harness_http::listener::Limits::from_env()?;
            eprintln!("cloud-harness: MCP over Streamable HTTP at http://{bound}/mcp");
            if mode == cloud_harness_auth::http::Mode::Tokens {
                first_start(&db, bound, workspaces.home())?;
            }
            crate::notify::notify("READY=1");
            {
                let stop = stop.clone();
                tokio::spawn(async move {
                    stop.cancelled().await;
                    crate::notify::notify("STOPPING=1");
                });
            }
            cloud_harness_http::listener::serve(listener, router, limits, stop).await;
            Ok(())
        }
    }
}
