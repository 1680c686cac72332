//! The driver as one backend sees it: every [`Api`] call forwarded, and counted in the
//! backend's [`Counters`] by kind, with the kernels, bytes and host waits it stands for.
//! Both drivers (libcuda and cuda-sim) are counted here, the same way.

use super::{Api, Ctx, CuError, Event, Func, Graph, GraphExec, Module, Opened, Stream};
use crate::host_counters::{Call, Counters};
use crate::launch::{Args, LaunchDims};

/// `api` counted into `counters`.
#[derive(Clone, Copy)]
pub(crate) struct Counted<'a> {
    pub api: &'static dyn Api,
    pub counters: &'a Counters,
}

impl Counted<'_> {
    fn count<T>(&self, c: Call, r: T) -> T {
        self.counters.call(c);
        r
    }
}

impl Api for Counted<'_> {
    fn version(&self) -> Result<i32, CuError> {
        self.count(Call::Other, self.api.version())
    }

    fn device_count(&self) -> Result<usize, CuError> {
        self.count(Call::Other, self.api.device_count())
    }

    fn open(&self, ordinal: usize) -> Result<Opened, CuError> {
        self.count(Call::Other, self.api.open(ordinal))
    }

    fn release(&self, ordinal: usize, ctx: Ctx) {
        self.api.release(ordinal, ctx);
        self.counters.call(Call::Other)
    }

    fn bind(&self, ctx: Ctx) -> Result<(), CuError> {
        // libcuda calls cuCtxSetCurrent only when the thread's context changes; count
        // both drivers by that rule.
        let switching = !super::is_current(ctx);
        let r = self.api.bind(ctx);
        if switching {
            self.counters.call(Call::Other);
            if r.is_ok() {
                super::note_current(ctx);
            }
        }
        r
    }

    fn enable_peer(&self, ctx: Ctx, ordinal: usize, peer_ctx: Ctx, peer: usize) -> bool {
        self.count(
            Call::Other,
            self.api.enable_peer(ctx, ordinal, peer_ctx, peer),
        )
    }

    fn module_load(&self, ctx: Ctx, file: &str, ptx: &str) -> Result<Module, CuError> {
        self.count(Call::Other, self.api.module_load(ctx, file, ptx))
    }

    fn module_unload(&self, m: Module) {
        self.api.module_unload(m);
        self.counters.call(Call::Other)
    }

    fn module_function(&self, m: Module, name: &str) -> Result<Func, CuError> {
        self.count(Call::Other, self.api.module_function(m, name))
    }

    fn func_set_max_dynamic_shared(&self, f: Func, bytes: u32) -> Result<(), CuError> {
        self.count(Call::Other, self.api.func_set_max_dynamic_shared(f, bytes))
    }

    fn launch(&self, f: Func, d: &LaunchDims, s: Stream, args: &mut Args) -> Result<(), CuError> {
        let r = self.count(Call::Launch, self.api.launch(f, d, s, args));
        if r.is_ok() {
            self.counters.kernel();
        }
        r
    }

    fn set_launch_tag(&self, s: Stream, tag: Option<u64>) {
        // Not a driver call of a real GPU (cuda-sim's profiler only): not counted.
        self.api.set_launch_tag(s, tag);
    }

    fn mem_alloc(&self, ctx: Ctx, size: usize) -> Result<u64, CuError> {
        self.count(Call::Other, self.api.mem_alloc(ctx, size))
    }

    fn mem_free(&self, ctx: Ctx, p: u64) -> Result<(), CuError> {
        self.count(Call::Other, self.api.mem_free(ctx, p))
    }

    fn mem_alloc_host(&self, ctx: Ctx, size: usize) -> Result<*mut u8, CuError> {
        self.count(Call::Other, self.api.mem_alloc_host(ctx, size))
    }

    fn mem_free_host(&self, ctx: Ctx, p: *mut u8) -> Result<(), CuError> {
        self.count(Call::Other, self.api.mem_free_host(ctx, p))
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        s: Stream,
    ) -> Result<(), CuError> {
        // SAFETY: forwarded with the caller's guarantees.
        let r = unsafe { self.api.memcpy_htod_async(dst, src, len, s) };
        let r = self.count(Call::MemcpyHtod, r);
        if r.is_ok() {
            self.counters.transfer(len as u64, 0);
        }
        r
    }

    unsafe fn memcpy_dtoh_pinned_async(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        s: Stream,
    ) -> Result<(), CuError> {
        // SAFETY: forwarded with the caller's guarantees.
        let r = unsafe { self.api.memcpy_dtoh_pinned_async(dst, src, len, s) };
        let r = self.count(Call::MemcpyDtoh, r);
        if r.is_ok() {
            self.counters.transfer(0, len as u64);
        }
        r
    }

    fn memcpy_dtod_async(&self, dst: u64, src: u64, len: usize, s: Stream) -> Result<(), CuError> {
        let r = self.count(
            Call::MemcpyDtod,
            self.api.memcpy_dtod_async(dst, src, len, s),
        );
        if r.is_ok() {
            self.counters.transfer(0, 0);
        }
        r
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
        let r = self
            .api
            .memcpy_peer_async(dst, dst_ctx, src, src_ctx, len, s);
        let r = self.count(Call::MemcpyDtod, r);
        if r.is_ok() {
            self.counters.transfer(0, 0);
        }
        r
    }

    fn memset_d8_async(&self, dst: u64, value: u8, len: usize, s: Stream) -> Result<(), CuError> {
        let r = self.count(Call::Memset, self.api.memset_d8_async(dst, value, len, s));
        if r.is_ok() {
            self.counters.transfer(0, 0);
        }
        r
    }

    fn stream_create(&self, ctx: Ctx) -> Result<Stream, CuError> {
        self.count(Call::Other, self.api.stream_create(ctx))
    }

    fn stream_destroy(&self, s: Stream) {
        self.api.stream_destroy(s);
        self.counters.call(Call::Other)
    }

    fn stream_synchronize(&self, s: Stream) -> Result<(), CuError> {
        self.counters.host_sync();
        self.count(Call::StreamSync, self.api.stream_synchronize(s))
    }

    fn stream_wait_event(&self, s: Stream, e: Event) -> Result<(), CuError> {
        self.count(Call::EventWait, self.api.stream_wait_event(s, e))
    }

    fn stream_begin_capture(&self, s: Stream) -> Result<(), CuError> {
        self.count(Call::Other, self.api.stream_begin_capture(s))
    }

    fn stream_end_capture(&self, s: Stream) -> Result<Graph, CuError> {
        self.count(Call::Other, self.api.stream_end_capture(s))
    }

    fn graph_instantiate(&self, g: Graph) -> Result<GraphExec, CuError> {
        self.count(Call::Other, self.api.graph_instantiate(g))
    }

    fn graph_destroy(&self, g: Graph) {
        self.api.graph_destroy(g);
        self.counters.call(Call::Other)
    }

    /// Counts the call; the backend counts what the graph runs (it knows its tally).
    fn graph_launch(&self, e: GraphExec, s: Stream) -> Result<(), CuError> {
        self.count(Call::GraphLaunch, self.api.graph_launch(e, s))
    }

    fn graph_exec_destroy(&self, e: GraphExec) {
        self.api.graph_exec_destroy(e);
        self.counters.call(Call::Other)
    }

    fn event_create(&self, ctx: Ctx) -> Result<Event, CuError> {
        self.count(Call::Other, self.api.event_create(ctx))
    }

    fn event_create_timed(&self, ctx: Ctx) -> Result<Event, CuError> {
        self.count(Call::Other, self.api.event_create_timed(ctx))
    }

    fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32, CuError> {
        self.count(Call::Other, self.api.event_elapsed_ms(start, end))
    }

    fn event_destroy(&self, e: Event) {
        self.api.event_destroy(e);
        self.counters.call(Call::Other)
    }

    fn event_record(&self, e: Event, s: Stream) -> Result<(), CuError> {
        self.count(Call::EventRecord, self.api.event_record(e, s))
    }

    fn event_query(&self, e: Event) -> Result<bool, CuError> {
        self.count(Call::EventQuery, self.api.event_query(e))
    }

    fn event_synchronize(&self, e: Event) -> Result<(), CuError> {
        self.counters.host_sync();
        self.count(Call::EventSync, self.api.event_synchronize(e))
    }
}
