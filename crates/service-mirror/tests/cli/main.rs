//! The real binary's commands against real apiservers: allow, link, export, unlink, check,
//! install and its RBAC, the Helm chart. One test binary.

#[path = "../support/rbac.rs"]
mod rbac_support;
#[path = "../support/mod.rs"]
mod support;

// What ../support/rbac.rs names as `super::controller`.
use support::controller;

mod commands;
mod links;
mod rbac;
