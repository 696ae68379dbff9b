//! The dashboards' listening sockets closed in a child made by `fork()`: the child has none of
//! the threads that serve them, and its copy kept the port open, so connections were accepted
//! and never answered once the parent stopped its dashboard (a training script's forked
//! workers outlive many loaders), and a new dashboard on the same port could not bind.
//!
//! Each listening socket is recorded in a fixed table of atomics while it serves; a handler
//! registered once with `pthread_atfork` closes every recorded one in the child, with nothing
//! but atomic loads and `close` (the child may not take a lock another thread held at the
//! fork). A socket's entry is cleared before the socket itself is closed, so a number the
//! parent reuses meanwhile is never closed in a child.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;

/// Dashboards serving at once whose sockets are recorded; one past these keeps its socket in
/// a forked child, as before.
const RECORDED: usize = 64;

/// No socket in this entry.
const EMPTY: i32 = -1;

static SOCKETS: [AtomicI32; RECORDED] = [const { AtomicI32::new(EMPTY) }; RECORDED];
static HANDLER: Once = Once::new();

/// A listening socket recorded for closing in forked children, until dropped.
#[derive(Debug)]
pub(crate) struct Recorded {
    /// The table's entry and the socket recorded in it.
    entry: Option<(usize, RawFd)>,
}

/// Records `socket` (a dashboard's listening socket) to be closed in any child forked while
/// it is recorded.
pub(crate) fn record(socket: RawFd) -> Recorded {
    HANDLER.call_once(|| {
        // SAFETY: registers a plain function with no parent or prepare handler; it runs in the
        // child only.
        let registered = unsafe { libc::pthread_atfork(None, None, Some(close_in_child)) };
        if registered != 0 {
            tracing::debug!(
                registered,
                "no fork handler: a forked child keeps the dashboard's socket"
            );
        }
    });
    let entry = SOCKETS.iter().position(|slot| {
        slot.compare_exchange(EMPTY, socket, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    });
    Recorded {
        entry: entry.map(|entry| (entry, socket)),
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        // Only its own socket: in a forked child the entry was emptied, and may record another.
        if let Some((entry, socket)) = self.entry {
            let _ =
                SOCKETS[entry].compare_exchange(socket, EMPTY, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

/// The child's handler: closes every recorded socket (atomics and `close` only).
extern "C" fn close_in_child() {
    for slot in &SOCKETS {
        let socket = slot.swap(EMPTY, Ordering::SeqCst);
        if socket != EMPTY {
            // SAFETY: the socket is this process's copy of a dashboard's listening socket;
            // nothing in the child uses it (the threads that did are not here).
            unsafe { libc::close(socket) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    use crate::Dashboard;

    /// A child forked while a dashboard serves does not hold its port: once the parent stops
    /// it, a connection is refused at once (it was accepted and never answered while the
    /// child lived), and the port binds again.
    #[test]
    fn a_forked_child_leaves_the_dashboards_port_to_its_parent() {
        let dashboard = Dashboard::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let address: SocketAddr = dashboard.local_addr();
        // SAFETY: the child only sleeps and exits (async-signal-safe calls).
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: as above.
            unsafe {
                libc::sleep(5);
                libc::_exit(0);
            }
        }
        drop(dashboard);
        let refused = TcpStream::connect_timeout(&address, Duration::from_secs(2));
        let again = std::net::TcpListener::bind(address);
        // SAFETY: ends and reaps the child this test forked.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        assert!(
            refused.is_err(),
            "a connection was accepted with no dashboard"
        );
        assert!(again.is_ok(), "{again:?}");
    }
}
