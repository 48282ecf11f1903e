//! Hostile input and the checks that watch for it: bad objects from a remote, a hostile remote
//! apiserver, and the safety monitor itself on a real audit log. One test binary.

#[path = "../support/mod.rs"]
mod support;

mod apiserver;
mod monitor;
mod objects;
