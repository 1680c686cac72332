//! cuda-sim's emulated driver as an [`Api`]: emulated GPUs `cuda-sim:N` whose PTX runs
//! in cuda-sim's interpreter with its checks on, and whose streams each run on a worker
//! thread with the driver's ordering rules (legacy NULL stream included).
//!
//! Handles map one to one onto cuda-sim's; the context of device N is `Ctx(N)`.

use std::sync::{Arc, OnceLock};

use cuda_sim::driver::{
    CaptureMode, Driver, EventHandle, FunctionHandle, GraphExecHandle, GraphHandle, ModuleHandle,
    StreamHandle,
};

use super::{intern, Api, Ctx, CuError, Event, Func, Graph, GraphExec, Module, Opened, Stream};
use cuda_sim::ptx::{Param, ParamType};

use crate::launch::{ArgKind, Args, LaunchDims};

struct Sim {
    drv: Arc<Driver>,
}

/// The process-wide emulated driver (configured by `CUDA_SIM_*` variables or
/// [`cuda_sim::driver::Driver::configure_global`] before first use).
pub(crate) fn api() -> Result<&'static dyn Api, CuError> {
    static SIM: OnceLock<Result<Sim, CuError>> = OnceLock::new();
    let sim = SIM.get_or_init(|| Driver::global().map(|drv| Sim { drv }).map_err(conv));
    match sim {
        Ok(s) => Ok(s),
        Err(e) => Err(*e),
    }
}

/// The emulated driver behind `cuda-sim` backends, for tests and tools that inspect it
/// (memory in use, fault reports, chaos).
pub(crate) fn driver() -> Result<Arc<Driver>, CuError> {
    Driver::global().map_err(conv)
}

fn conv(e: cuda_sim::CuError) -> CuError {
    CuError::new(
        intern(format!("cuda-sim: {}: {}", e.code.name(), e.detail)),
        e.code as i64,
    )
}

/// The packed argument list against the kernel's `.param` list: count, order, sizes and
/// types. On a GPU a mismatch reads garbage; here it is a launch error naming the slot.
pub(crate) fn check_packing(params: &[Param], kinds: &[ArgKind]) -> Result<(), CuError> {
    let bad = |why: String| {
        Err(CuError::new(
            intern(format!(
                "cuda-sim: CUDA_ERROR_INVALID_VALUE: kernel arguments: {why}"
            )),
            cuda_sim::ErrorCode::InvalidValue as i64,
        ))
    };
    if params.len() != kinds.len() {
        return bad(format!(
            "{} packed, the kernel declares {} parameters",
            kinds.len(),
            params.len()
        ));
    }
    for (i, (p, k)) in params.iter().zip(kinds).enumerate() {
        let float = matches!(p.ty, ParamType::Float);
        let ok = p.size == k.size()
            && match k {
                ArgKind::F32 => float,
                ArgKind::U32 | ArgKind::U64 => matches!(p.ty, ParamType::Int { .. }),
            };
        if !ok {
            return bad(format!(
                "argument {i} packed as {k:?}, parameter '{}' is {:?} of {} bytes",
                p.name, p.ty, p.size
            ));
        }
    }
    Ok(())
}

fn dev(c: Ctx) -> usize {
    c.0 as usize
}

impl Api for Sim {
    fn version(&self) -> Result<i32, CuError> {
        Ok(self.drv.version())
    }

    fn device_count(&self) -> Result<usize, CuError> {
        Ok(self.drv.device_count())
    }

    fn open(&self, ordinal: usize) -> Result<Opened, CuError> {
        let opened = Opened {
            ctx: Ctx(ordinal as u64),
            name: self.drv.device_name(ordinal).map_err(conv)?,
            cc: self.drv.compute_capability(ordinal).map_err(conv)?,
        };
        self.drv.primary_ctx_retain(ordinal).map_err(conv)?;
        Ok(opened)
    }

    fn release(&self, ordinal: usize, _ctx: Ctx) {
        // The last release resets the context (a poisoned one becomes usable again).
        let _ = self.drv.primary_ctx_release(ordinal);
    }

    fn bind(&self, ctx: Ctx) -> Result<(), CuError> {
        // Every call names its device explicitly; binding only reports a poisoned context,
        // as cuCtxSetCurrent's callers see the sticky error on their next call.
        match self.drv.context_error(dev(ctx)) {
            Some(e) => Err(conv(e)),
            None => Ok(()),
        }
    }

    fn enable_peer(&self, ctx: Ctx, ordinal: usize, _peer_ctx: Ctx, peer: usize) -> bool {
        debug_assert_eq!(dev(ctx), ordinal);
        if !self.drv.can_access_peer(ordinal, peer).unwrap_or(false) {
            return false;
        }
        match self.drv.enable_peer_access(ordinal, peer) {
            Ok(()) => true,
            Err(e) => e.code == cuda_sim::ErrorCode::PeerAccessAlreadyEnabled,
        }
    }

    fn module_load(&self, ctx: Ctx, file: &str, ptx: &str) -> Result<Module, CuError> {
        let m = self.drv.module_load(dev(ctx), file, ptx).map_err(|e| {
            eprintln!(
                "ggml-cuda: cuda-sim could not load kernels/{file}: {}",
                e.detail
            );
            conv(e)
        })?;
        Ok(Module(m.0))
    }

    fn module_unload(&self, m: Module) {
        let _ = self.drv.module_unload(ModuleHandle(m.0));
    }

    fn module_function(&self, m: Module, name: &str) -> Result<Func, CuError> {
        let f = self
            .drv
            .module_function(ModuleHandle(m.0), name)
            .map_err(conv)?;
        Ok(Func(f.0))
    }

    fn func_set_max_dynamic_shared(&self, f: Func, bytes: u32) -> Result<(), CuError> {
        self.drv
            .function_set_max_dynamic_shared(FunctionHandle(f.0), bytes)
            .map_err(conv)
    }

    fn launch(&self, f: Func, d: &LaunchDims, s: Stream, args: &mut Args) -> Result<(), CuError> {
        let f = FunctionHandle(f.0);
        let params = self.drv.function_params(f).map_err(conv)?;
        check_packing(&params, args.kinds())?;
        // Each value sits in its own 8-byte slot, low bytes first: a parameter of size
        // n reads the slot's first n bytes, as libcuda does through kernelParams.
        let slots: Vec<[u8; 8]> = args.slots().iter().map(|v| v.to_le_bytes()).collect();
        let values: Vec<&[u8]> = slots
            .iter()
            .zip(&params)
            .map(|(s, p)| &s[..p.size])
            .collect();
        self.drv
            .launch_ex(
                f,
                [d.grid.0, d.grid.1, d.grid.2],
                [d.block.0, d.block.1, d.block.2],
                d.shared,
                StreamHandle(s.0),
                &values,
                d.programmatic,
            )
            .map_err(conv)
    }

    fn set_launch_tag(&self, s: Stream, tag: Option<u64>) {
        // A bad handle fails the launch that follows, with the driver's error.
        let _ = self.drv.set_launch_tag(StreamHandle(s.0), tag);
    }

    fn mem_alloc(&self, ctx: Ctx, size: usize) -> Result<u64, CuError> {
        self.drv.mem_alloc(dev(ctx), size).map_err(conv)
    }

    fn mem_free(&self, _ctx: Ctx, p: u64) -> Result<(), CuError> {
        self.drv.mem_free(p).map_err(conv)
    }

    fn mem_alloc_host(&self, _ctx: Ctx, size: usize) -> Result<*mut u8, CuError> {
        self.drv.mem_alloc_host(size).map_err(conv)
    }

    fn mem_free_host(&self, _ctx: Ctx, p: *mut u8) -> Result<(), CuError> {
        self.drv.mem_free_host(p).map_err(conv)
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        s: Stream,
    ) -> Result<(), CuError> {
        // SAFETY: the caller keeps src valid until the copy completed (this method's
        // contract), which is what cuda-sim's asks.
        unsafe { self.drv.memcpy_htod_async(dst, src, len, StreamHandle(s.0)) }.map_err(conv)
    }

    unsafe fn memcpy_dtoh_pinned_async(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        s: Stream,
    ) -> Result<(), CuError> {
        // SAFETY: the caller keeps the pinned `dst` valid and untouched until the copy
        // completed, which is what cuda-sim's asks.
        unsafe { self.drv.memcpy_dtoh_async(dst, src, len, StreamHandle(s.0)) }.map_err(conv)
    }

    fn memcpy_dtod_async(&self, dst: u64, src: u64, len: usize, s: Stream) -> Result<(), CuError> {
        self.drv
            .memcpy_dtod_async(dst, src, len, StreamHandle(s.0))
            .map_err(conv)
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
        self.drv
            .memcpy_peer_async(dst, dev(dst_ctx), src, dev(src_ctx), len, StreamHandle(s.0))
            .map_err(conv)
    }

    fn memset_d8_async(&self, dst: u64, value: u8, len: usize, s: Stream) -> Result<(), CuError> {
        self.drv
            .memset_d8_async(dst, value, len, StreamHandle(s.0))
            .map_err(conv)
    }

    fn stream_create(&self, ctx: Ctx) -> Result<Stream, CuError> {
        let s = self.drv.stream_create(dev(ctx), true).map_err(conv)?;
        Ok(Stream(s.0))
    }

    fn stream_destroy(&self, s: Stream) {
        let _ = self.drv.stream_destroy(StreamHandle(s.0));
    }

    fn stream_synchronize(&self, s: Stream) -> Result<(), CuError> {
        self.drv.stream_synchronize(StreamHandle(s.0)).map_err(conv)
    }

    fn stream_wait_event(&self, s: Stream, e: Event) -> Result<(), CuError> {
        self.drv
            .stream_wait_event(StreamHandle(s.0), EventHandle(e.0))
            .map_err(conv)
    }

    fn stream_begin_capture(&self, s: Stream) -> Result<(), CuError> {
        self.drv
            .stream_begin_capture(StreamHandle(s.0), CaptureMode::ThreadLocal)
            .map_err(conv)
    }

    fn stream_end_capture(&self, s: Stream) -> Result<Graph, CuError> {
        let g = self
            .drv
            .stream_end_capture(StreamHandle(s.0))
            .map_err(conv)?;
        Ok(Graph(g.0))
    }

    fn graph_instantiate(&self, g: Graph) -> Result<GraphExec, CuError> {
        let e = self.drv.graph_instantiate(GraphHandle(g.0)).map_err(conv)?;
        Ok(GraphExec(e.0))
    }

    fn graph_destroy(&self, g: Graph) {
        let _ = self.drv.graph_destroy(GraphHandle(g.0));
    }

    fn graph_launch(&self, e: GraphExec, s: Stream) -> Result<(), CuError> {
        self.drv
            .graph_launch(GraphExecHandle(e.0), StreamHandle(s.0))
            .map_err(conv)
    }

    fn graph_exec_destroy(&self, e: GraphExec) {
        let _ = self.drv.graph_exec_destroy(GraphExecHandle(e.0));
    }

    fn event_create(&self, ctx: Ctx) -> Result<Event, CuError> {
        let e = self.drv.event_create(dev(ctx)).map_err(conv)?;
        Ok(Event(e.0))
    }

    fn event_create_timed(&self, ctx: Ctx) -> Result<Event, CuError> {
        let e = self.drv.event_create_timed(dev(ctx)).map_err(conv)?;
        Ok(Event(e.0))
    }

    fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32, CuError> {
        self.drv
            .event_elapsed_ms(EventHandle(start.0), EventHandle(end.0))
            .map_err(conv)
    }

    fn event_destroy(&self, e: Event) {
        let _ = self.drv.event_destroy(EventHandle(e.0));
    }

    fn event_record(&self, e: Event, s: Stream) -> Result<(), CuError> {
        self.drv
            .event_record(EventHandle(e.0), StreamHandle(s.0))
            .map_err(conv)
    }

    fn event_query(&self, e: Event) -> Result<bool, CuError> {
        match self.drv.event_query(EventHandle(e.0)) {
            Ok(()) => Ok(true),
            Err(e) if e.code == cuda_sim::ErrorCode::NotReady => Ok(false),
            Err(e) => Err(conv(e)),
        }
    }

    fn event_synchronize(&self, e: Event) -> Result<(), CuError> {
        self.drv.event_synchronize(EventHandle(e.0)).map_err(conv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(name: &str, ty: ParamType, size: usize) -> Param {
        Param {
            name: name.into(),
            ty,
            size,
            align: size,
        }
    }

    #[test]
    fn packing_is_checked_by_count_order_size_and_type() {
        let int = ParamType::Int { signed: false };
        let params = [
            param("p_x", int, 8),
            param("p_n", int, 4),
            param("p_scale", ParamType::Float, 4),
        ];
        let ok = [ArgKind::U64, ArgKind::U32, ArgKind::F32];
        assert!(check_packing(&params, &ok).is_ok());
        let refused = |kinds: &[ArgKind], why: &str| {
            let e = check_packing(&params, kinds).unwrap_err().to_string();
            assert!(
                e.contains("CUDA_ERROR_INVALID_VALUE") && e.contains(why),
                "{e}"
            );
        };
        refused(&ok[..2], "2 packed, the kernel declares 3");
        refused(
            &[ArgKind::U64, ArgKind::F32, ArgKind::U32],
            "argument 1 packed as F32, parameter 'p_n'",
        );
        refused(
            &[ArgKind::U32, ArgKind::U32, ArgKind::F32],
            "argument 0 packed as U32, parameter 'p_x'",
        );
    }
}
