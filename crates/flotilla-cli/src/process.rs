//! What a long-running command (`local`, `meta`, `server`, `mount`, `metrics`) does at its
//! edges: print a line its starter waits for, and wait for Ctrl-C or SIGTERM.

use std::io::Write;

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

pub fn announce(line: String) {
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}
