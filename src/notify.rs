//! The service manager's readiness protocol (`sd_notify`): when systemd starts the server as
//! a `Type=notify` unit it sets `NOTIFY_SOCKET`, and the server says `READY=1` once it
//! listens and `STOPPING=1` when it begins to stop. Without the variable, nothing is sent.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (`READY=1`, `STOPPING=1`) to the service manager, if there is one. A
/// failure is logged, not fatal: the server works the same without a manager.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET").filter(|p| !p.is_empty()) else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|socket| {
        let bytes = path.as_encoded_bytes();
        // `@name` is a socket in the abstract namespace.
        if let Some(name) = bytes.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(state.as_bytes(), &addr)
        } else {
            socket.send_to(state.as_bytes(), &path)
        }
    });
    if let Err(e) = sent {
        tracing::warn!(error = %e, state, "cannot notify the service manager");
    }
}
