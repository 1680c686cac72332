//! The CUDA driver: loading libcuda at run time, per-device state (primary context and
//! the PTX modules, loaded once per context), and error codes.
//!
//! All `unsafe` FFI of the crate lives here and in `backend.rs` / `ops.rs` launch code.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::driver::sys;

use crate::kernels::{KernelId, MODULES};

/// Every driver symbol this crate calls, under the names the cudarc bindings load.
/// Checked before the first call so that a missing one is an error, not a panic.
pub const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxEnablePeerAccess",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventQuery",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocHost_v2",
    "cuMemFreeHost",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyPeerAsync",
    "cuMemsetD8_v2",
    "cuMemsetD8Async",
    "cuModuleLoadDataEx",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncSetAttribute",
    "cuLaunchKernel",
];

/// A failed driver call: what was called and the `CUresult` code (0 when the failure
/// is not a driver code, e.g. a missing library).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CuError {
    /// What failed, e.g. `"cuMemAlloc failed"`.
    pub what: &'static str,
    /// The `CUresult` value.
    pub code: i64,
}

/// `Ok` if `r` is `CUDA_SUCCESS`.
pub(crate) fn ck(r: sys::CUresult, what: &'static str) -> Result<(), CuError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CuError {
            what,
            code: r as i64,
        })
    }
}

/// Loads libcuda, checks every symbol and calls `cuInit` once per process. The result
/// is cached. Never panics.
pub fn driver() -> Result<(), CuError> {
    static STATE: OnceLock<Result<(), CuError>> = OnceLock::new();
    *STATE.get_or_init(|| {
        std::panic::catch_unwind(init_driver).unwrap_or(Err(CuError {
            what: "loading libcuda panicked",
            code: 0,
        }))
    })
}

fn init_driver() -> Result<(), CuError> {
    // SAFETY: only tries to open the library.
    if !unsafe { sys::is_culib_present() } {
        return Err(CuError {
            what: "libcuda (the NVIDIA driver library) was not found: no NVIDIA driver installed",
            code: 0,
        });
    }
    // SAFETY: present per the check above, so culib() does not panic.
    let lib = unsafe { sys::culib() };
    for name in REQUIRED_SYMBOLS {
        // SAFETY: looks the symbol up without calling it.
        let found = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok();
        if !found {
            return Err(CuError {
                what: "libcuda lacks a required symbol: the driver is older than CUDA 13.0 (driver 580)",
                code: 0,
            });
        }
    }
    // SAFETY: every symbol exists.
    let r = unsafe { sys::cuInit(0) };
    if r == sys::CUresult::CUDA_ERROR_NO_DEVICE {
        return Err(CuError {
            what: "cuInit: no CUDA-capable device",
            code: r as i64,
        });
    }
    ck(r, "cuInit failed")
}

/// Number of CUDA devices (an error if the driver cannot be used).
pub fn device_count() -> Result<usize, CuError> {
    driver()?;
    let mut n: c_int = 0;
    // SAFETY: driver initialised.
    ck(
        unsafe { sys::cuDeviceGetCount(&mut n) },
        "cuDeviceGetCount failed",
    )?;
    Ok(n.max(0) as usize)
}

/// The driver's CUDA version as `1000 · major + 10 · minor` (13000 for CUDA 13.0), an
/// error if the driver cannot be used.
pub fn driver_version() -> Result<i32, CuError> {
    driver()?;
    let mut v: c_int = 0;
    // SAFETY: driver initialised; `v` is a valid out pointer.
    ck(
        unsafe { sys::cuDriverGetVersion(&mut v) },
        "cuDriverGetVersion failed",
    )?;
    Ok(v)
}

/// The loaded kernels of one device.
pub(crate) struct Kernels {
    funcs: Vec<sys::CUfunction>,
}

impl Kernels {
    pub(crate) fn get(&self, id: KernelId) -> sys::CUfunction {
        self.funcs[id as usize]
    }
}

/// Per-GPU state shared by every backend instance on it (virtual devices included).
pub(crate) struct Device {
    pub ordinal: i32,
    pub dev: sys::CUdevice,
    pub ctx: sys::CUcontext,
    pub name: String,
    pub cc: (i32, i32),
    pub kernels: Kernels,
    modules: Vec<sys::CUmodule>,
    /// Device ordinals whose contexts this context has enabled peer access to (or for
    /// which that failed: `false`).
    pub peers: Mutex<Vec<(i32, bool)>>,
}

// SAFETY: the handles are opaque driver objects usable from any thread once the
// context is made current, which every entry point of this crate does first.
unsafe impl Send for Device {}
// SAFETY: as above; mutable state is behind a Mutex.
unsafe impl Sync for Device {}

impl Device {
    /// Makes this device's primary context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<(), CuError> {
        // SAFETY: ctx is a retained primary context.
        ck(
            unsafe { sys::cuCtxSetCurrent(self.ctx) },
            "cuCtxSetCurrent failed",
        )
    }

    /// Enables access from this context to `peer`'s memory if the hardware allows it.
    /// Returns whether peer access is on. Copies work without it (staged by the driver).
    pub(crate) fn enable_peer(&self, peer: &Device) -> bool {
        if peer.ordinal == self.ordinal {
            return true;
        }
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, on)) = peers.iter().find(|(o, _)| *o == peer.ordinal) {
            return on;
        }
        let mut can: c_int = 0;
        // SAFETY: valid device handles.
        let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.dev, peer.dev) };
        let mut on = false;
        if r == sys::CUresult::CUDA_SUCCESS && can != 0 && self.bind().is_ok() {
            // SAFETY: our context is current; peer.ctx is a retained primary context.
            let r = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx, 0) };
            on = r == sys::CUresult::CUDA_SUCCESS
                || r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
        }
        peers.push((peer.ordinal, on));
        on
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            for &m in &self.modules {
                // SAFETY: loaded by us; no backend of this device is alive any more.
                unsafe { sys::cuModuleUnload(m) };
            }
        }
        // SAFETY: balances the retain in open_device.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// The shared state of GPU `ordinal`, created (context retained, modules JIT-loaded)
/// on first use and kept while any backend uses it.
pub(crate) fn device(ordinal: usize) -> Result<Arc<Device>, CuError> {
    static DEVICES: Mutex<Vec<(i32, Weak<Device>)>> = Mutex::new(Vec::new());
    let ordinal = i32::try_from(ordinal).map_err(|_| CuError {
        what: "device ordinal out of range",
        code: 0,
    })?;
    let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = devices
        .iter()
        .find(|(o, _)| *o == ordinal)
        .and_then(|(_, w)| w.upgrade())
    {
        return Ok(d);
    }
    let d = Arc::new(open_device(ordinal)?);
    devices.retain(|(o, w)| *o != ordinal && w.strong_count() > 0);
    devices.push((ordinal, Arc::downgrade(&d)));
    Ok(d)
}

fn open_device(ordinal: i32) -> Result<Device, CuError> {
    let count = device_count()?;
    if ordinal as usize >= count {
        return Err(CuError {
            what: "no CUDA device with this ordinal",
            code: 0,
        });
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: driver initialised, ordinal in range.
    ck(
        unsafe { sys::cuDeviceGet(&mut dev, ordinal) },
        "cuDeviceGet failed",
    )?;
    let mut name_buf = [0 as c_char; 256];
    // SAFETY: the buffer holds 256 bytes.
    ck(
        unsafe { sys::cuDeviceGetName(name_buf.as_mut_ptr(), 256, dev) },
        "cuDeviceGetName failed",
    )?;
    // SAFETY: the driver NUL-terminates the name within the buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(name_buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let attr = |a: sys::CUdevice_attribute| -> Result<i32, CuError> {
        let mut v: c_int = 0;
        // SAFETY: valid device and attribute.
        ck(
            unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) },
            "cuDeviceGetAttribute failed",
        )?;
        Ok(v)
    };
    let cc = (
        attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    if cc.0 < 8 {
        return Err(CuError {
            what: "GPU too old: the PTX kernels target sm_80 (Ampere) and newer",
            code: 0,
        });
    }
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid device.
    ck(
        unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
        "cuDevicePrimaryCtxRetain failed",
    )?;
    let mut device = Device {
        ordinal,
        dev,
        ctx,
        name,
        cc,
        kernels: Kernels { funcs: Vec::new() },
        modules: Vec::new(),
        peers: Mutex::new(Vec::new()),
    };
    device.bind()?;
    for m in MODULES {
        let module = load_module(m.file, m.source)?;
        device.modules.push(module);
        for &(id, entry) in m.kernels {
            let cname = std::ffi::CString::new(entry).map_err(|_| CuError {
                what: "kernel name contains NUL",
                code: 0,
            })?;
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: module loaded in the current context.
            ck(
                unsafe { sys::cuModuleGetFunction(&mut f, module, cname.as_ptr()) },
                "cuModuleGetFunction failed (kernel missing from its PTX module)",
            )?;
            let idx = id as usize;
            if device.kernels.funcs.len() <= idx {
                device.kernels.funcs.resize(idx + 1, std::ptr::null_mut());
            }
            device.kernels.funcs[idx] = f;
        }
    }
    Ok(device)
}

/// JIT-compiles one PTX module. On failure the driver's log is printed to stderr and
/// kept (leaked once) in the error text.
fn load_module(file: &'static str, source: &'static str) -> Result<sys::CUmodule, CuError> {
    let image = std::ffi::CString::new(source).map_err(|_| CuError {
        what: "PTX source contains NUL",
        code: 0,
    })?;
    let mut log = vec![0u8; 16 * 1024];
    let mut opts = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut vals: [*mut c_void; 2] = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: image is NUL-terminated PTX; the option arrays have 2 entries and the log
    // buffer outlives the call.
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            image.as_ptr() as *const c_void,
            opts.len() as c_uint,
            opts.as_mut_ptr(),
            vals.as_mut_ptr(),
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end]);
        eprintln!("ggml-cuda: JIT of kernels/{file} failed: {text}");
        let what: &'static str = Box::leak(
            format!("cuModuleLoadDataEx failed for kernels/{file}: {text}").into_boxed_str(),
        );
        return Err(CuError {
            what,
            code: r as i64,
        });
    }
    Ok(module)
}
