//! The worker daemon crate's integration tests, one binary: `daemon` runs the `stoker-worker`
//! binary as a user does (its help, its logs); `in_memory` runs the daemon with a coordinator
//! service and remote clients in one process on an in-memory network (cut streams, refused
//! tokens, a coordinator answering as an older build or recording the session updates it gets:
//! `proxy_coordinator`). The daemons as separate processes are tested from the `stoker` CLI
//! crate's tests.

mod daemon;
mod in_memory;
mod proxy_coordinator;
