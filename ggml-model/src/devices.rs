//! Device lists: parsing `--devices` and creating the backends.

use std::fmt;
use std::str::FromStr;

use ggml_cuda::DriverKind;

use crate::error::{ModelError, Result};

/// One entry of a device list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// `cpu` or `cpu:N`: N CPU backend instances with their own queues, sharing the
    /// threads.
    Cpu {
        /// Number of virtual devices.
        count: usize,
    },
    /// `cuda:G` or `cuda:GxN`: N backend instances (streams) on GPU `G`; `cuda-sim:G`
    /// and `cuda-sim:GxN` the same on cuda-sim's emulated GPU `G`.
    Cuda {
        /// The real driver (`cuda`) or the emulated one (`cuda-sim`).
        driver: DriverKind,
        /// GPU ordinal.
        gpu: usize,
        /// Number of virtual devices on that GPU.
        count: usize,
    },
}

/// A parsed `--devices` list such as `cpu:2` or `cuda:0x2,cpu`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceList(pub Vec<DeviceSpec>);

impl DeviceList {
    /// Total number of backend instances.
    pub fn count(&self) -> usize {
        self.0
            .iter()
            .map(|d| match d {
                DeviceSpec::Cpu { count } | DeviceSpec::Cuda { count, .. } => *count,
            })
            .sum()
    }
}

impl FromStr for DeviceList {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<DeviceList> {
        let bad = |item: &str, why: &str| {
            ModelError::Usage(format!(
                "--devices: {item:?}: {why} (expected cpu, cpu:N, cuda:G, cuda:GxN, cuda-sim:G or cuda-sim:GxN, comma-separated)"
            ))
        };
        let mut out = Vec::new();
        for item in s.split(',').map(str::trim) {
            if item.is_empty() {
                return Err(bad(item, "empty entry"));
            }
            let (kind, rest) = item.split_once(':').unwrap_or((item, ""));
            let num = |t: &str| t.parse::<usize>().map_err(|_| bad(item, "not a number"));
            match kind {
                "cpu" => {
                    let count = if rest.is_empty() { 1 } else { num(rest)? };
                    if count == 0 || count > 16 {
                        return Err(bad(item, "between 1 and 16 virtual CPU devices"));
                    }
                    out.push(DeviceSpec::Cpu { count });
                }
                "cuda" | "cuda-sim" => {
                    let driver = if kind == "cuda" {
                        DriverKind::Cuda
                    } else {
                        DriverKind::Sim
                    };
                    if rest.is_empty() {
                        return Err(bad(item, "name the GPU, e.g. cuda:0 or cuda-sim:0"));
                    }
                    let (gpu, count) = match rest.split_once('x') {
                        Some((g, n)) => (num(g)?, num(n)?),
                        None => (num(rest)?, 1),
                    };
                    if count == 0 || count > 16 {
                        return Err(bad(item, "between 1 and 16 virtual devices per GPU"));
                    }
                    out.push(DeviceSpec::Cuda { driver, gpu, count });
                }
                _ => return Err(bad(item, "unknown device kind")),
            }
        }
        Ok(DeviceList(out))
    }
}

impl fmt::Display for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match d {
                DeviceSpec::Cpu { count: 1 } => f.write_str("cpu")?,
                DeviceSpec::Cpu { count } => write!(f, "cpu:{count}")?,
                DeviceSpec::Cuda {
                    driver,
                    gpu,
                    count: 1,
                } => write!(f, "{}:{gpu}", driver.prefix())?,
                DeviceSpec::Cuda { driver, gpu, count } => {
                    write!(f, "{}:{gpu}x{count}", driver.prefix())?
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists() {
        let l: DeviceList = "cpu:3,cuda:0x2,cuda:1,cuda-sim:0x2,cuda-sim:1"
            .parse()
            .unwrap();
        assert_eq!(l.count(), 9);
        assert_eq!(
            l.to_string(),
            "cpu:3,cuda:0x2,cuda:1,cuda-sim:0x2,cuda-sim:1"
        );
        assert_eq!(
            l.0[3],
            DeviceSpec::Cuda {
                driver: DriverKind::Sim,
                gpu: 0,
                count: 2
            }
        );
        for bad in [
            "",
            "gpu",
            "cpu:0",
            "cpu:x",
            "cuda",
            "cuda:0x0",
            "cpu,,cpu",
            "cpu:99",
            "cuda-sim",
            "cuda-sim:x",
            "cuda-sim:0x0",
            "cudasim:0",
        ] {
            assert!(bad.parse::<DeviceList>().is_err(), "{bad}");
        }
    }
}
