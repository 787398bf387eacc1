//! One module per group of subcommands.

pub mod bench;
pub mod demo;
pub mod rig;
pub mod service;
pub mod sim;
