//! The emulated machine's configuration: how many devices, how much memory each, the
//! chaos seed, the checks and the interpreter's host threads. Read from `CUDA_SIM_*`
//! environment variables by [`SimConfig::from_env`].

use crate::fault::Checks;

/// Default number of emulated devices.
pub const DEFAULT_DEVICES: usize = 2;
/// Default memory per device: 4 GiB.
pub const DEFAULT_MEMORY: u64 = 4 << 30;
/// The most devices one driver emulates (each gets its own 1 TiB address window).
pub const MAX_DEVICES: usize = 64;

/// What the emulated driver emulates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Number of devices (`CUDA_SIM_DEVICES`, default 2; 0 to 64).
    pub devices: usize,
    /// Bytes of device memory per device (`CUDA_SIM_MEMORY`, default 4 GiB). Only live
    /// allocations count; memory is backed lazily, as it is touched.
    pub memory_per_device: u64,
    /// Seed of the chaos delays (`CUDA_SIM_CHAOS`), `None` for none: with a seed every
    /// stream sleeps a random 0..=200 µs before half of its operations, so that the
    /// interleaving of streams varies with the seed.
    pub chaos_seed: Option<u64>,
    /// The interpreter's checks (`CUDA_SIM_CHECKS`: `all`, `none`, or a comma list of
    /// `memcheck`, `racecheck`, `synccheck`, `initcheck`, `approx`).
    /// `approx` is [`Checks::approx_at_bound`].
    pub checks: Checks,
    /// Host threads one kernel launch may use (`CUDA_SIM_THREADS`, default: the
    /// available parallelism).
    pub exec_threads: usize,
    /// Run kernels in the interpreter (`CUDA_SIM_INTERPRET`, default `1`). With `0`
    /// every launch is still checked as on a GPU (kernel, arguments against its
    /// parameters, grid and block dimensions, shared memory), ordered on its stream and
    /// counted ([`Driver::launches_executed`](crate::driver::Driver::launches_executed)),
    /// but its code does not run: copies, memsets, events, graphs and faults of the
    /// driver behave as always, while the bytes kernels would write are never written,
    /// so memory contents and results are meaningless. For measuring what a program asks
    /// of the driver (calls, launches, waits, bytes copied) quickly, on models far too
    /// large to interpret.
    pub interpret: bool,
    /// The compute capability the devices report (`CUDA_SIM_ARCH`: `sm_80`, the default,
    /// or `sm_90`). A module whose `.target` is newer does not load, and launches with
    /// programmatic stream serialisation need sm_90, as on a GPU; the arithmetic is the
    /// same on both.
    pub compute_capability: (i32, i32),
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            devices: DEFAULT_DEVICES,
            memory_per_device: DEFAULT_MEMORY,
            chaos_seed: None,
            checks: Checks::ALL,
            exec_threads: default_threads(),
            interpret: true,
            compute_capability: super::COMPUTE_CAPABILITY,
        }
    }
}

/// The host's available parallelism (1 if unknown).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl SimConfig {
    /// The configuration the `CUDA_SIM_*` environment variables ask for (defaults for
    /// unset ones). A bad value is an error naming the variable and the value.
    pub fn from_env() -> Result<SimConfig, String> {
        SimConfig::from_lookup(|name| {
            std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
        })
    }

    /// As [`from_env`](SimConfig::from_env), with the variables read through `get`
    /// (for tests, or for configuration kept elsewhere).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<SimConfig, String> {
        let mut cfg = SimConfig::default();
        let var = |name: &str| {
            get(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let bad = |name: &str, value: &str, want: &str| format!("{name}={value:?}: {want}");
        if let Some(v) = var("CUDA_SIM_DEVICES") {
            cfg.devices = v
                .parse::<usize>()
                .ok()
                .filter(|&n| n <= MAX_DEVICES)
                .ok_or_else(|| {
                    bad(
                        "CUDA_SIM_DEVICES",
                        &v,
                        &format!("expected a count from 0 to {MAX_DEVICES}"),
                    )
                })?;
        }
        if let Some(v) = var("CUDA_SIM_MEMORY") {
            cfg.memory_per_device = parse_size(&v).filter(|&n| n > 0).ok_or_else(|| {
                bad(
                    "CUDA_SIM_MEMORY",
                    &v,
                    "expected a positive byte count with an optional K, M, G or T suffix (e.g. 4G)",
                )
            })?;
        }
        if let Some(v) = var("CUDA_SIM_CHAOS") {
            cfg.chaos_seed = Some(parse_u64(&v).ok_or_else(|| {
                bad(
                    "CUDA_SIM_CHAOS",
                    &v,
                    "expected a seed (an unsigned integer)",
                )
            })?);
        }
        if let Some(v) = var("CUDA_SIM_CHECKS") {
            cfg.checks = parse_checks(&v).ok_or_else(|| {
                bad(
                    "CUDA_SIM_CHECKS",
                    &v,
                    "expected all, none, or a comma list of memcheck, racecheck, synccheck, initcheck, approx",
                )
            })?;
        }
        if let Some(v) = var("CUDA_SIM_THREADS") {
            cfg.exec_threads = v.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
                bad(
                    "CUDA_SIM_THREADS",
                    &v,
                    "expected a thread count of 1 or more",
                )
            })?;
        }
        if let Some(v) = var("CUDA_SIM_INTERPRET") {
            cfg.interpret = match v.to_ascii_lowercase().as_str() {
                "1" | "true" | "on" | "yes" => true,
                "0" | "false" | "off" | "no" => false,
                _ => {
                    return Err(bad(
                        "CUDA_SIM_INTERPRET",
                        &v,
                        "expected 1 (run kernels) or 0 (check and count launches only)",
                    ))
                }
            };
        }
        if let Some(v) = var("CUDA_SIM_ARCH") {
            cfg.compute_capability = match v.to_ascii_lowercase().as_str() {
                "sm_80" | "80" | "8.0" => (8, 0),
                "sm_90" | "90" | "9.0" => (9, 0),
                _ => return Err(bad("CUDA_SIM_ARCH", &v, "expected sm_80 or sm_90")),
            };
        }
        Ok(cfg)
    }
}

/// A decimal or `0x` hexadecimal `u64`.
fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// A byte count with an optional binary suffix: `4096`, `64K`, `512M`, `4G`, `1T`
/// (case-insensitive, an optional trailing `B` or `iB` allowed: `4GiB`, `4gb`).
pub fn parse_size(s: &str) -> Option<u64> {
    let lower = s.trim().to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match body.as_bytes().last()? {
        b'k' => (&body[..body.len() - 1], 10),
        b'm' => (&body[..body.len() - 1], 20),
        b'g' => (&body[..body.len() - 1], 30),
        b't' => (&body[..body.len() - 1], 40),
        _ => (body, 0),
    };
    let digits = digits.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// `all`, `none`, or a comma list of check names (case-insensitive).
pub fn parse_checks(s: &str) -> Option<Checks> {
    let s = s.trim().to_ascii_lowercase();
    match s.as_str() {
        "all" => return Some(Checks::ALL),
        "none" => return Some(Checks::NONE),
        _ => {}
    }
    let mut c = Checks::NONE;
    for name in s.split(',').map(str::trim) {
        match name {
            "memcheck" => c.memcheck = true,
            "racecheck" => c.racecheck = true,
            "synccheck" => c.synccheck = true,
            "initcheck" => c.initcheck = true,
            "approx" => c.approx_at_bound = true,
            _ => return None,
        }
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("512m"), Some(512 << 20));
        assert_eq!(parse_size("4G"), Some(4 << 30));
        assert_eq!(parse_size("4GiB"), Some(4 << 30));
        assert_eq!(parse_size("2gb"), Some(2 << 30));
        assert_eq!(parse_size("1T"), Some(1 << 40));
        assert_eq!(parse_size("100B"), Some(100));
        for bad in [
            "",
            "G",
            "4X",
            "-1",
            "1.5G",
            "4 G G",
            "0x10",
            "99999999999999999999T",
        ] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
