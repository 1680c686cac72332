//! The process-wide driver and the environment. One test in this binary (its own
//! process), because it sets `CUDA_SIM_*` variables and creates the global driver.

use cuda_sim::driver::{Driver, SimConfig};
use cuda_sim::{Checks, ErrorCode};

const VARS: [&str; 6] = [
    "CUDA_SIM_DEVICES",
    "CUDA_SIM_MEMORY",
    "CUDA_SIM_CHAOS",
    "CUDA_SIM_CHECKS",
    "CUDA_SIM_THREADS",
    "CUDA_SIM_INTERPRET",
];

#[test]
fn environment_and_the_global_driver() {
    for v in VARS {
        std::env::remove_var(v);
    }
    assert_eq!(SimConfig::from_env().unwrap(), SimConfig::default());

    std::env::set_var("CUDA_SIM_DEVICES", "3");
    std::env::set_var("CUDA_SIM_MEMORY", "256M");
    std::env::set_var("CUDA_SIM_CHAOS", "7");
    std::env::set_var("CUDA_SIM_CHECKS", "racecheck");
    std::env::set_var("CUDA_SIM_THREADS", "2");
    std::env::set_var("CUDA_SIM_INTERPRET", "0");
    std::env::set_var("CUDA_SIM_ARCH", "sm_90");
    let cfg = SimConfig::from_env().unwrap();
    assert_eq!(
        cfg,
        SimConfig {
            devices: 3,
            memory_per_device: 256 << 20,
            chaos_seed: Some(7),
            checks: Checks {
                racecheck: true,
                ..Checks::NONE
            },
            exec_threads: 2,
            interpret: false,
            compute_capability: (9, 0),
        }
    );

    // A bad variable: global() fails, naming it, and creates nothing.
    std::env::set_var("CUDA_SIM_INTERPRET", "maybe");
    let e = SimConfig::from_env().unwrap_err();
    assert!(
        e.contains("CUDA_SIM_INTERPRET") && e.contains("maybe"),
        "{e}"
    );
    std::env::set_var("CUDA_SIM_INTERPRET", "1");
    std::env::set_var("CUDA_SIM_MEMORY", "lots");
    let e = Driver::global().err().expect("a bad CUDA_SIM_MEMORY");
    assert_eq!(e.code, ErrorCode::InvalidValue);
    assert!(
        e.detail.contains("CUDA_SIM_MEMORY") && e.detail.contains("lots"),
        "{e}"
    );

    // configure_global wins over the environment, once.
    let mine = SimConfig {
        devices: 1,
        memory_per_device: 1 << 20,
        ..SimConfig::default()
    };
    Driver::configure_global(mine.clone()).unwrap();
    let g = Driver::global().unwrap();
    assert_eq!(g.device_count(), 1);
    assert_eq!(g.total_memory(0).unwrap(), 1 << 20);
    assert!(std::sync::Arc::ptr_eq(&g, &Driver::global().unwrap()));
    Driver::configure_global(mine.clone()).unwrap();
    let e = Driver::configure_global(SimConfig { devices: 2, ..mine }).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidValue);
    assert!(e.detail.contains("already initialised"), "{e}");

    let p = g.mem_alloc(0, 64).unwrap();
    g.memcpy_htod(p, &[5; 64]).unwrap();
    let mut out = [0u8; 64];
    g.memcpy_dtoh(&mut out, p).unwrap();
    assert_eq!(out, [5; 64]);
    g.mem_free(p).unwrap();
}
