//! The commands of `ggml-harness`: one module per command, each with its flags (a clap
//! `Args` struct) and a `run` function; `main.rs` only parses and dispatches.

pub mod bench;
pub mod calibrate;
pub mod common;
pub mod cost_model;
pub mod fault_sweep;
pub mod fetch_model;
pub mod fit_cost_model;
pub mod generate;
pub mod make_moe;
pub mod perplexity;
pub mod plan;
pub mod profile;
pub mod regress;
pub mod run_args;
pub mod synth_model;
pub mod tokenize;
pub mod trace_summary;
