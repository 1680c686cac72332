//! The NVIDIA driver (libcuda), loaded at run time through cudarc's `sys` bindings.
//!
//! All `unsafe` FFI to libcuda lives here.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use cudarc::driver::sys;

use super::{intern, Api, Ctx, CuError, Event, Func, Graph, GraphExec, Module, Opened, Stream};
use crate::launch::{Args, LaunchDims};

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
    "cuEventElapsedTime_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocHost_v2",
    "cuMemFreeHost",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyPeerAsync",
    "cuMemsetD8Async",
    "cuModuleLoadDataEx",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncSetAttribute",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphDestroy",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
];

/// `Ok` if `r` is `CUDA_SUCCESS`.
fn ck(r: sys::CUresult, what: &'static str) -> Result<(), CuError> {
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

/// JIT-compiles one PTX module. On failure the driver's log is printed to stderr and
/// kept (leaked once) in the error text.
fn load_module(file: &str, source: &str) -> Result<sys::CUmodule, CuError> {
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
        let what = intern(format!(
            "cuModuleLoadDataEx failed for kernels/{file}: {text}"
        ));
        return Err(CuError {
            what,
            code: r as i64,
        });
    }
    Ok(module)
}

/// The libcuda implementation of [`Api`].
struct LibCuda;

/// libcuda, once loaded and initialised (see [`driver`]).
pub(crate) fn api() -> Result<&'static dyn Api, CuError> {
    static LIB: LibCuda = LibCuda;
    driver()?;
    Ok(&LIB)
}

fn cu_device(ordinal: usize) -> Result<sys::CUdevice, CuError> {
    let ordinal =
        c_int::try_from(ordinal).map_err(|_| CuError::new("device ordinal out of range", 0))?;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: driver initialised; the driver checks the ordinal.
    ck(
        unsafe { sys::cuDeviceGet(&mut dev, ordinal) },
        "cuDeviceGet failed",
    )?;
    Ok(dev)
}

fn ctx_of(c: Ctx) -> sys::CUcontext {
    c.0 as usize as sys::CUcontext
}
fn stream_of(s: Stream) -> sys::CUstream {
    s.0 as usize as sys::CUstream
}
fn event_of(e: Event) -> sys::CUevent {
    e.0 as usize as sys::CUevent
}
fn graph_of(g: Graph) -> sys::CUgraph {
    g.0 as usize as sys::CUgraph
}
fn exec_of(e: GraphExec) -> sys::CUgraphExec {
    e.0 as usize as sys::CUgraphExec
}

impl Api for LibCuda {
    fn version(&self) -> Result<i32, CuError> {
        driver_version()
    }

    fn device_count(&self) -> Result<usize, CuError> {
        device_count()
    }

    fn open(&self, ordinal: usize) -> Result<Opened, CuError> {
        let dev = cu_device(ordinal)?;
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
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid device.
        ck(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain failed",
        )?;
        Ok(Opened {
            ctx: Ctx(ctx as usize as u64),
            name,
            cc,
        })
    }

    fn release(&self, ordinal: usize, _ctx: Ctx) {
        if let Ok(dev) = cu_device(ordinal) {
            // SAFETY: balances the retain in `open`.
            unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
        }
    }

    fn bind(&self, ctx: Ctx) -> Result<(), CuError> {
        // A context switch is a driver call on every backend method: skipped when this
        // thread made `ctx` current already.
        if super::is_current(ctx) {
            return Ok(());
        }
        // SAFETY: ctx is a retained primary context.
        ck(
            unsafe { sys::cuCtxSetCurrent(ctx_of(ctx)) },
            "cuCtxSetCurrent failed",
        )?;
        super::note_current(ctx);
        Ok(())
    }

    fn enable_peer(&self, ctx: Ctx, ordinal: usize, peer_ctx: Ctx, peer: usize) -> bool {
        let (Ok(dev), Ok(peer_dev)) = (cu_device(ordinal), cu_device(peer)) else {
            return false;
        };
        let mut can: c_int = 0;
        // SAFETY: valid device handles.
        let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer_dev) };
        if r != sys::CUresult::CUDA_SUCCESS || can == 0 || self.bind(ctx).is_err() {
            return false;
        }
        // SAFETY: our context is current; peer_ctx is a retained primary context.
        let r = unsafe { sys::cuCtxEnablePeerAccess(ctx_of(peer_ctx), 0) };
        r == sys::CUresult::CUDA_SUCCESS
            || r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
    }

    fn module_load(&self, ctx: Ctx, file: &str, ptx: &str) -> Result<Module, CuError> {
        self.bind(ctx)?;
        load_module(file, ptx).map(|m| Module(m as usize as u64))
    }

    fn module_unload(&self, m: Module) {
        // SAFETY: loaded by `module_load`; no backend of its device is alive any more.
        unsafe { sys::cuModuleUnload(m.0 as usize as sys::CUmodule) };
    }

    fn module_function(&self, m: Module, name: &str) -> Result<Func, CuError> {
        let cname = std::ffi::CString::new(name)
            .map_err(|_| CuError::new("kernel name contains NUL", 0))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: module loaded in the current context; cname is NUL-terminated.
        ck(
            unsafe {
                sys::cuModuleGetFunction(&mut f, m.0 as usize as sys::CUmodule, cname.as_ptr())
            },
            "cuModuleGetFunction failed (kernel missing from its PTX module)",
        )?;
        Ok(Func(f as usize as u64))
    }

    fn func_set_max_dynamic_shared(&self, f: Func, bytes: u32) -> Result<(), CuError> {
        let bytes = i32::try_from(bytes)
            .map_err(|_| CuError::new("dynamic shared memory size out of range", 0))?;
        // SAFETY: a function handle of a loaded module.
        ck(
            unsafe {
                sys::cuFuncSetAttribute(
                    f.0 as usize as sys::CUfunction,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes,
                )
            },
            "cuFuncSetAttribute failed",
        )
    }

    fn launch(&self, f: Func, d: &LaunchDims, s: Stream, args: &mut Args) -> Result<(), CuError> {
        let mut ptrs = [std::ptr::null_mut::<c_void>(); Args::MAX];
        let params = args.pointers(&mut ptrs);
        if d.programmatic {
            // Programmatic dependent launch: one attribute, programmatic stream
            // serialisation allowed (the kernel waits with griddepcontrol.wait).
            // SAFETY: an all-zero attribute is a valid value of this plain C union.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: d.grid.0,
                gridDimY: d.grid.1,
                gridDimZ: d.grid.2,
                blockDimX: d.block.0,
                blockDimY: d.block.1,
                blockDimZ: d.block.2,
                sharedMemBytes: d.shared,
                hStream: stream_of(s),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as below; `config` and `attr` outlive the call.
            return ck(
                unsafe {
                    sys::cuLaunchKernelEx(
                        &config,
                        f.0 as usize as sys::CUfunction,
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                },
                "cuLaunchKernelEx failed",
            );
        }
        // SAFETY: `params` points at `args`' slots, which outlive the call (the driver
        // copies the values at launch); the caller matched the argument list to the
        // kernel's .param list and range-checked every pointer argument.
        ck(
            unsafe {
                sys::cuLaunchKernel(
                    f.0 as usize as sys::CUfunction,
                    d.grid.0,
                    d.grid.1,
                    d.grid.2,
                    d.block.0,
                    d.block.1,
                    d.block.2,
                    d.shared,
                    stream_of(s),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel failed",
        )
    }

    fn mem_alloc(&self, ctx: Ctx, size: usize) -> Result<u64, CuError> {
        self.bind(ctx)?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: context current.
        ck(
            unsafe { sys::cuMemAlloc_v2(&mut p, size) },
            "cuMemAlloc failed",
        )?;
        Ok(p)
    }

    fn mem_free(&self, ctx: Ctx, p: u64) -> Result<(), CuError> {
        self.bind(ctx)?;
        // SAFETY: allocated by `mem_alloc`; the caller guarantees no queued use.
        ck(unsafe { sys::cuMemFree_v2(p) }, "cuMemFree failed")
    }

    fn mem_alloc_host(&self, ctx: Ctx, size: usize) -> Result<*mut u8, CuError> {
        self.bind(ctx)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: context current.
        ck(
            unsafe { sys::cuMemAllocHost_v2(&mut p, size) },
            "cuMemAllocHost failed",
        )?;
        Ok(p as *mut u8)
    }

    fn mem_free_host(&self, ctx: Ctx, p: *mut u8) -> Result<(), CuError> {
        self.bind(ctx)?;
        // SAFETY: allocated by `mem_alloc_host`; the caller guarantees no queued use.
        ck(
            unsafe { sys::cuMemFreeHost(p as *mut c_void) },
            "cuMemFreeHost failed",
        )
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        s: Stream,
    ) -> Result<(), CuError> {
        // SAFETY: the caller keeps src valid until the copy completed; dst range-checked.
        ck(
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, stream_of(s)) },
            "cuMemcpyHtoDAsync failed",
        )
    }

    unsafe fn memcpy_dtoh_pinned_async(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        s: Stream,
    ) -> Result<(), CuError> {
        // SAFETY: the caller range-checked src and keeps the pinned dst valid and
        // untouched until the copy completed.
        ck(
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, stream_of(s)) },
            "cuMemcpyDtoHAsync failed",
        )
    }

    fn memcpy_dtod_async(&self, dst: u64, src: u64, len: usize, s: Stream) -> Result<(), CuError> {
        // SAFETY: both ranges range-checked by the caller, in the current context.
        ck(
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, stream_of(s)) },
            "cuMemcpyDtoDAsync failed",
        )
    }

    fn memcpy_peer_async(
        &self,
        dst: u64,
        dst_ctx: Ctx,
        src: u64,
        src_ctx: Ctx,
        len: usize,
        s: Stream,
    ) -> Result<(), CuError> {
        // SAFETY: contexts retained, ranges checked by the caller; without peer access
        // the driver stages the copy through the host.
        ck(
            unsafe {
                sys::cuMemcpyPeerAsync(
                    dst,
                    ctx_of(dst_ctx),
                    src,
                    ctx_of(src_ctx),
                    len,
                    stream_of(s),
                )
            },
            "cuMemcpyPeerAsync failed",
        )
    }

    fn memset_d8_async(&self, dst: u64, value: u8, len: usize, s: Stream) -> Result<(), CuError> {
        // SAFETY: the caller range-checked dst..dst+len.
        ck(
            unsafe { sys::cuMemsetD8Async(dst, value, len, stream_of(s)) },
            "cuMemsetD8Async failed",
        )
    }

    fn stream_create(&self, ctx: Ctx) -> Result<Stream, CuError> {
        self.bind(ctx)?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: context current.
        ck(
            unsafe {
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                )
            },
            "cuStreamCreate failed",
        )?;
        Ok(Stream(stream as usize as u64))
    }

    fn stream_destroy(&self, s: Stream) {
        // SAFETY: a stream created by `stream_create`, drained by the caller.
        unsafe { sys::cuStreamDestroy_v2(stream_of(s)) };
    }

    fn stream_synchronize(&self, s: Stream) -> Result<(), CuError> {
        // SAFETY: a live stream.
        ck(
            unsafe { sys::cuStreamSynchronize(stream_of(s)) },
            "cuStreamSynchronize failed (a queued kernel or copy failed)",
        )
    }

    fn stream_wait_event(&self, s: Stream, e: Event) -> Result<(), CuError> {
        // SAFETY: a live stream and event (events of other contexts are allowed).
        ck(
            unsafe { sys::cuStreamWaitEvent(stream_of(s), event_of(e), 0) },
            "cuStreamWaitEvent failed",
        )
    }

    fn stream_begin_capture(&self, s: Stream) -> Result<(), CuError> {
        // SAFETY: a live stream of the current context.
        ck(
            unsafe {
                sys::cuStreamBeginCapture_v2(
                    stream_of(s),
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            },
            "cuStreamBeginCapture failed",
        )
    }

    fn stream_end_capture(&self, s: Stream) -> Result<Graph, CuError> {
        let mut g: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: a live stream; `g` is a valid out pointer.
        ck(
            unsafe { sys::cuStreamEndCapture(stream_of(s), &mut g) },
            "cuStreamEndCapture failed (the capture was invalidated)",
        )?;
        Ok(Graph(g as usize as u64))
    }

    fn graph_instantiate(&self, g: Graph) -> Result<GraphExec, CuError> {
        let mut e: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: a graph from `stream_end_capture`; `e` is a valid out pointer.
        ck(
            unsafe { sys::cuGraphInstantiateWithFlags(&mut e, graph_of(g), 0) },
            "cuGraphInstantiate failed",
        )?;
        Ok(GraphExec(e as usize as u64))
    }

    fn graph_destroy(&self, g: Graph) {
        // SAFETY: a graph from `stream_end_capture`, not used afterwards.
        unsafe { sys::cuGraphDestroy(graph_of(g)) };
    }

    fn graph_launch(&self, e: GraphExec, s: Stream) -> Result<(), CuError> {
        // SAFETY: a live executable graph and stream of the same context; the pointers
        // baked into it are kept alive by the caller while it may run.
        ck(
            unsafe { sys::cuGraphLaunch(exec_of(e), stream_of(s)) },
            "cuGraphLaunch failed",
        )
    }

    fn graph_exec_destroy(&self, e: GraphExec) {
        // SAFETY: a live executable graph, not launched afterwards (one in flight
        // completes: the driver frees it then).
        unsafe { sys::cuGraphExecDestroy(exec_of(e)) };
    }

    fn event_create(&self, ctx: Ctx) -> Result<Event, CuError> {
        self.bind(ctx)?;
        let mut ev: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: context current.
        ck(
            unsafe { sys::cuEventCreate(&mut ev, flags) },
            "cuEventCreate failed",
        )?;
        Ok(Event(ev as usize as u64))
    }

    fn event_create_timed(&self, ctx: Ctx) -> Result<Event, CuError> {
        self.bind(ctx)?;
        let mut ev: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT as u32;
        // SAFETY: context current.
        ck(
            unsafe { sys::cuEventCreate(&mut ev, flags) },
            "cuEventCreate failed",
        )?;
        Ok(Event(ev as usize as u64))
    }

    fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32, CuError> {
        let mut ms = 0f32;
        // SAFETY: two live events; the driver checks that they are timed and complete.
        ck(
            unsafe { sys::cuEventElapsedTime_v2(&mut ms, event_of(start), event_of(end)) },
            "cuEventElapsedTime failed",
        )?;
        Ok(ms)
    }

    fn event_destroy(&self, e: Event) {
        // SAFETY: an event created by `event_create`; the caller guarantees no pending wait.
        unsafe { sys::cuEventDestroy_v2(event_of(e)) };
    }

    fn event_record(&self, e: Event, s: Stream) -> Result<(), CuError> {
        // SAFETY: a live event and stream.
        ck(
            unsafe { sys::cuEventRecord(event_of(e), stream_of(s)) },
            "cuEventRecord failed",
        )
    }

    fn event_query(&self, e: Event) -> Result<bool, CuError> {
        // SAFETY: a live event.
        let r = unsafe { sys::cuEventQuery(event_of(e)) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        ck(r, "cuEventQuery failed").map(|_| true)
    }

    fn event_synchronize(&self, e: Event) -> Result<(), CuError> {
        // SAFETY: a live event; an unrecorded event completes at once.
        ck(
            unsafe { sys::cuEventSynchronize(event_of(e)) },
            "cuEventSynchronize failed",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::REQUIRED_SYMBOLS;

    /// Every driver function this file calls is checked for before the first call, so an
    /// old driver is an error naming the reason, not a panic inside cudarc's loader.
    #[test]
    fn every_called_symbol_is_required() {
        let src = include_str!("libcuda.rs");
        let mut called: Vec<&str> = src
            .match_indices("sys::cu")
            .filter_map(|(i, _)| {
                let rest = &src[i + 5..];
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
                let name = &rest[..end];
                // Driver functions: `cu` and a capital, called (cudarc's own `culib` is not).
                let is_fn = name.as_bytes().get(2).is_some_and(u8::is_ascii_uppercase);
                (is_fn && rest[end..].starts_with('(')).then_some(name)
            })
            .collect();
        called.sort_unstable();
        called.dedup();
        assert!(called.len() > 30, "{called:?}");
        for name in called {
            assert!(
                REQUIRED_SYMBOLS.contains(&name),
                "{name} is called but not in REQUIRED_SYMBOLS"
            );
        }
    }
}
