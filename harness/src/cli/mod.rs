//! The commands of `ggml-harness`: one module per command, each with its flags (a clap
//! `Args` struct) and a `run` function; `main.rs` only parses and dispatches.

pub mod bench;
pub mod calibrate;
pub mod common;
pub mod fit_cost_model;
pub mod generate;
pub mod perplexity;
pub mod profile;
pub mod run_args;
pub mod tokenize;
