//! The loader's integration tests, one binary (one link, one process): each module is one
//! area, `common` holds the shared fixtures. Tests that start daemons or the dashboard bind
//! port 0 and keep their state in their own temporary folders, so they run side by side.

mod architecture;
mod auth;
mod bad_input;
mod cli;
mod columns;
mod common;
mod convert;
mod dashboard;
mod distributed;
mod drain;
mod embedded;
mod gpu;
mod hostile;
mod lane_helper;
mod mix;
mod object_store;
mod resize;
mod resources;
mod sharded;
mod shares;
mod soak;
mod tokens;
