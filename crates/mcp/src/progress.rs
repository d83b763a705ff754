//! What an MCP client sees of long work in progress, as `notifications/progress` against its
//! request's `progressToken`: a `workspace_open`'s steps (and its cancellation when the request
//! is cancelled), a `skills_run`'s time and output.

use cloud_harness_workspace::progress::OpenProgress;
use rmcp::model::ProgressNotificationParam;
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use std::sync::Arc;
use std::time::Duration;

/// How often an open in progress is looked at: for a cancel, and for progress to tell.
const OPEN_WATCH: std::time::Duration = std::time::Duration::from_millis(200);

/// Watches an open until it is aborted: a cancelled request (`notifications/cancelled`, or
/// the client gone) cancels it; with a `progressToken`, each change of its steps or bytes is
/// a `notifications/progress` whose `progress` only grows (steps done, plus a part of a step
/// for the bytes fetched in it) against `total` steps.
pub(crate) async fn watch_open(progress: Arc<OpenProgress>, context: RequestContext<RoleServer>) {
    let token = context.meta.get_progress_token();
    let mut told = -1.0f64;
    loop {
        tokio::select! {
            _ = context.ct.cancelled() => {
                progress.cancel();
                return;
            }
            _ = tokio::time::sleep(OPEN_WATCH) => {}
        }
        let Some(token) = token.clone() else { continue };
        let now = progress.snapshot();
        if now.total == 0 {
            continue;
        }
        // Bytes move a step on by at most nine tenths of it, so a step done is always more.
        let part = 0.9 * (1.0 - 1.0 / (1.0 + now.bytes as f64 / (1 << 20) as f64));
        let value = now.done as f64 + part;
        if value <= told {
            continue;
        }
        told = value;
        let mut param = ProgressNotificationParam::new(token, value);
        param.total = Some(now.total as f64 + 1.0);
        param.message = Some(format!(
            "{} ({} of {} steps done, {} bytes fetched)",
            now.step, now.done, now.total, now.bytes
        ));
        let _ = context.peer.notify_progress(param).await;
    }
}

/// What a run tells each second while it runs: how long it has run and its output so far.
pub(crate) fn of_run(
    context: &RequestContext<RoleServer>,
) -> impl Fn(Duration, u64) + Send + 'static {
    let token = context.meta.get_progress_token();
    let peer = context.peer.clone();
    move |elapsed, bytes| {
        if let Some(token) = token.clone() {
            let peer = peer.clone();
            let mut param = ProgressNotificationParam::new(token, elapsed.as_secs_f64());
            param.message = Some(format!(
                "running for {} s, {bytes} bytes of output",
                elapsed.as_secs()
            ));
            tokio::spawn(async move {
                let _ = peer.notify_progress(param).await;
            });
        }
    }
}
