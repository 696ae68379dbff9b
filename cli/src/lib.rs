//! The library half of the `stoker-cli` crate: the harnesses `stoker bench` runs ([`bench`](mod@bench)),
//! apart from the loader and the coordinator they measure. The command line itself (argument
//! parsing and dispatch) is the binary, `src/main.rs` and `src/commands/`.

pub mod bench;
