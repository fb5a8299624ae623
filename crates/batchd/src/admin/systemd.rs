//! systemd notifications (`sd_notify`): ready, stopping, the status line, and the watchdog pings that stop when
//! the process is no longer alive. Each is a no-op when the daemon does not run under systemd.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Health;

/// Tells systemd the daemon is ready (no-op without `$NOTIFY_SOCKET`).
pub fn notify_ready() {
    notify(&[sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status("running")]);
}

/// Tells systemd the daemon is stopping (no-op without `$NOTIFY_SOCKET`).
pub fn notify_stopping() {
    notify(&[sd_notify::NotifyState::Stopping, sd_notify::NotifyState::Status("draining work in flight")]);
}

/// Updates the status line `systemctl status` shows (no-op without `$NOTIFY_SOCKET`).
pub(super) fn notify_status(status: &str) {
    notify(&[sd_notify::NotifyState::Status(status)]);
}

fn notify(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::warn!(error = %error, "cannot notify systemd");
    }
}

/// The watchdog interval systemd asked for (`$WATCHDOG_USEC`, for this process per `$WATCHDOG_PID`), halved as
/// sd_watchdog_enabled(3) advises; `None` when the watchdog is off.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().filter(|timeout| !timeout.is_zero()).map(|timeout| timeout / 2)
}

/// Sends `WATCHDOG=1` every `interval` while `health` says the process is alive, until `stop` is cancelled. A
/// wedged runtime or a dead worker stops the pings, and systemd restarts the service. Redis being down does not:
/// the daemon rides that out by itself.
pub async fn run_watchdog(interval: Duration, health: Arc<Health>, stop: CancellationToken) {
    tracing::info!(interval = ?interval, "systemd watchdog enabled");
    loop {
        if health.liveness().is_ok() {
            notify(&[sd_notify::NotifyState::Watchdog]);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
