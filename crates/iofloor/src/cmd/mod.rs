//! One module per group of subcommands.

pub mod bench;
pub mod cluster;
pub mod demo;
pub mod guest;
pub mod rig;
pub mod service;
pub mod sim;
