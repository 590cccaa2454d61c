//! How the lease worker waits and hears that it must stop: sleeps on its latch that end at a
//! SIGTERM, for the worker's own loop and for the registries' waits alike. A SIGHUP reloads the
//! configuration at the end of the wait it came in.
//!
//! A SIGTERM means one of two things. At a server shutdown, the worker closes the gate, releases its
//! lease and ends. Sent to the worker alone (`pg_terminate_backend`), it leaves at once with a
//! status that makes the postmaster start a new worker, which renews the same lease.

use crate::server;
use pgrx::bgworkers::BackgroundWorker;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Set once SIGTERM came at a server shutdown; the worker then releases its lease and ends.
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// Whether the server is shutting down, as far as this worker has heard.
pub fn shutting_down() -> bool {
    SHUTTING_DOWN.load(Ordering::Relaxed)
}

/// Waits on the latch for up to `duration`; false once the server shuts down (or the postmaster
/// died).
pub fn wait(duration: Duration) -> bool {
    if !shutting_down() && BackgroundWorker::wait_latch(Some(duration)) {
        server::absorb_barriers();
        if BackgroundWorker::sighup_received() {
            server::reload_configuration();
        }
        return true;
    }
    note_sigterm();
    false
}

/// Sleeps on the latch for all of `duration`, however often it is set meanwhile; false once the
/// server shuts down.
pub fn sleep_unless_stopped(duration: Duration) -> bool {
    let deadline = Instant::now() + duration;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        if !wait(left) {
            return false;
        }
    }
}

/// Whether a SIGTERM arrived since the last look, for waits on the latch elsewhere. A worker
/// terminated alone ends here; at a server shutdown, this remembers it and returns true. Once the
/// shutdown is known, a SIGTERM asks nothing new (the postmaster may send more than one), so that
/// the release, which has a budget of its own, is not cut short.
pub fn sigterm_arrived() -> bool {
    BackgroundWorker::sigterm_received() && !shutting_down() && {
        note_sigterm();
        true
    }
}

fn note_sigterm() {
    leave_unless_server_stopping();
    SHUTTING_DOWN.store(true, Ordering::Relaxed);
}

/// Ends the worker for a new one to take over, unless the whole server is shutting down.
pub fn leave_unless_server_stopping() {
    if !server_stopping() {
        server::exit_for_restart();
    }
}

/// Whether the postmaster is shutting down, rather than someone terminating this worker alone.
fn server_stopping() -> bool {
    let pid_file = Path::new(&server::server_identity().data_directory).join("postmaster.pid");
    std::fs::read_to_string(pid_file).is_ok_and(|text| postmaster_stopping(&text))
}

/// Whether the postmaster is shutting down, from the text of its `postmaster.pid`, whose eighth
/// line it sets to `stopping` before it asks its children to exit.
pub fn postmaster_stopping(pid_file: &str) -> bool {
    pid_file.lines().nth(7).map(str::trim) == Some("stopping")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_postmaster_pid_file_tells_a_shutdown() {
        let running = "4242\n/var/lib/postgresql/15/main\n1795953600\n5432\n/run/postgresql\n*\n  5432001         0\nready   \n";
        assert!(!postmaster_stopping(running));
        assert!(postmaster_stopping(
            &running.replace("ready   ", "stopping")
        ));
        assert!(!postmaster_stopping("4242\n"));
        assert!(!postmaster_stopping(""));
    }
}
