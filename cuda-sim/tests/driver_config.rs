//! The emulated driver's configuration (the `CUDA_SIM_*` variables, read here through
//! `SimConfig::from_lookup` so that tests do not touch the process environment) and its
//! device queries.

use std::collections::HashMap;

use cuda_sim::driver::{Driver, SimConfig, DEFAULT_MEMORY};
use cuda_sim::{Checks, ErrorCode};

fn parse(vars: &[(&str, &str)]) -> Result<SimConfig, String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    SimConfig::from_lookup(|k| map.get(k).cloned())
}

#[test]
fn defaults() {
    let cfg = parse(&[]).unwrap();
    assert_eq!(cfg, SimConfig::default());
    assert_eq!(cfg.devices, 2);
    assert_eq!(cfg.memory_per_device, 4 << 30);
    assert_eq!(cfg.memory_per_device, DEFAULT_MEMORY);
    assert_eq!(cfg.chaos_seed, None);
    assert_eq!(cfg.checks, Checks::ALL);
    assert!(cfg.exec_threads >= 1);
    // Empty values count as unset.
    assert_eq!(
        parse(&[("CUDA_SIM_CHAOS", ""), ("CUDA_SIM_DEVICES", " ")]).unwrap(),
        cfg
    );
}

#[test]
fn every_variable() {
    let cfg = parse(&[
        ("CUDA_SIM_DEVICES", "3"),
        ("CUDA_SIM_MEMORY", "512M"),
        ("CUDA_SIM_CHAOS", "42"),
        ("CUDA_SIM_CHECKS", "memcheck, initcheck, approx"),
        ("CUDA_SIM_THREADS", "3"),
    ])
    .unwrap();
    assert_eq!(cfg.devices, 3);
    assert_eq!(cfg.memory_per_device, 512 << 20);
    assert_eq!(cfg.chaos_seed, Some(42));
    assert_eq!(
        cfg.checks,
        Checks {
            memcheck: true,
            racecheck: false,
            synccheck: false,
            initcheck: true,
            approx_at_bound: true,
            ..Checks::NONE
        }
    );
    assert_eq!(cfg.exec_threads, 3);
    let sizes = [
        ("4096", 4096u64),
        ("64k", 64 << 10),
        ("2G", 2 << 30),
        ("1GiB", 1 << 30),
    ];
    for (text, bytes) in sizes {
        assert_eq!(
            parse(&[("CUDA_SIM_MEMORY", text)])
                .unwrap()
                .memory_per_device,
            bytes
        );
    }
    assert_eq!(
        parse(&[("CUDA_SIM_CHECKS", "none")]).unwrap().checks,
        Checks::NONE
    );
    assert_eq!(
        parse(&[("CUDA_SIM_CHECKS", "ALL")]).unwrap().checks,
        Checks::ALL
    );
    assert_eq!(
        parse(&[("CUDA_SIM_CHAOS", "0x10")]).unwrap().chaos_seed,
        Some(16)
    );
    assert_eq!(parse(&[("CUDA_SIM_DEVICES", "0")]).unwrap().devices, 0);
    assert_eq!(cfg.compute_capability, (8, 0));
    assert_eq!(
        parse(&[("CUDA_SIM_ARCH", "SM_90")])
            .unwrap()
            .compute_capability,
        (9, 0)
    );
}

#[test]
fn bad_values_name_the_variable_and_the_value() {
    let cases = [
        ("CUDA_SIM_DEVICES", "two"),
        ("CUDA_SIM_DEVICES", "65"),
        ("CUDA_SIM_DEVICES", "-1"),
        ("CUDA_SIM_MEMORY", "4X"),
        ("CUDA_SIM_MEMORY", "0"),
        ("CUDA_SIM_MEMORY", "G"),
        ("CUDA_SIM_CHAOS", "seed"),
        ("CUDA_SIM_CHECKS", "memcheck,bogus"),
        ("CUDA_SIM_CHECKS", "all,none"),
        ("CUDA_SIM_THREADS", "0"),
        ("CUDA_SIM_THREADS", "many"),
        ("CUDA_SIM_ARCH", "sm_75"),
    ];
    for (var, value) in cases {
        let e = parse(&[(var, value)]).unwrap_err();
        assert!(e.contains(var) && e.contains(value), "{var}={value}: {e}");
    }
}

#[test]
fn device_queries() {
    let drv = Driver::new(SimConfig {
        devices: 3,
        memory_per_device: 1 << 20,
        ..SimConfig::default()
    });
    assert_eq!(drv.version(), 13000);
    assert_eq!(drv.device_count(), 3);
    assert_eq!(drv.config().devices, 3);
    assert_eq!(
        drv.device_name(2).unwrap(),
        "cuda-sim GPU 2 (emulated sm_80)"
    );
    assert_eq!(drv.compute_capability(0).unwrap(), (8, 0));
    assert_eq!(drv.total_memory(1).unwrap(), 1 << 20);
    assert_eq!(drv.used_memory(1).unwrap(), 0);
    for e in [
        drv.device_name(3).unwrap_err(),
        drv.compute_capability(3).unwrap_err(),
        drv.total_memory(3).unwrap_err(),
        drv.used_memory(usize::MAX).unwrap_err(),
        drv.device_synchronize(3).unwrap_err(),
    ] {
        assert_eq!(e.code, ErrorCode::InvalidDevice);
    }
    assert!(drv.context_error(3).is_none());
    assert!(drv.fault_reports().is_empty());
    assert_eq!(drv.warp_instructions(), 0);
}

#[test]
fn no_devices() {
    let drv = Driver::new(SimConfig {
        devices: 0,
        ..SimConfig::default()
    });
    assert_eq!(drv.device_count(), 0);
    assert_eq!(
        drv.mem_alloc(0, 16).unwrap_err().code,
        ErrorCode::InvalidDevice
    );
    assert_eq!(
        drv.stream_create(0, true).unwrap_err().code,
        ErrorCode::InvalidDevice
    );
    assert_eq!(
        drv.memcpy_htod(0x7000_0000_0000, &[1]).unwrap_err().code,
        ErrorCode::InvalidValue
    );
}
