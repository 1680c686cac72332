//! Device and pinned memory, copies and memsets, with the driver's documented host
//! synchronisation:
//!
//! - `memcpy_htod` from pageable memory synchronises the legacy stream, stages the bytes
//!   and returns before they land; from pinned memory it returns once they landed.
//! - `memcpy_dtoh` returns once the bytes arrived. `memset_d8` is asynchronous.
//! - The async copies read pinned sources and write pinned destinations when they
//!   execute; a pageable source is staged at the call, and a copy into pageable memory
//!   waits for its completion.
//!
//! Device ranges are checked at the call (inside one live allocation, else
//! `CUDA_ERROR_INVALID_VALUE`) and again when the copy runs (freed since: a fault).

use std::sync::{Arc, Mutex};

use super::lock;
use super::memory::device_of;
use super::ops::{DeviceCopy, Fill, HostDst, HostSrc, Op};
use super::pinned::HostPtr;
use super::stream::StreamShared;
use super::{Driver, InjectedError, StreamHandle};
use crate::error::{CuError, ErrorCode};
use crate::mem::MemError;

impl Driver {
    /// The device holding all of `[addr, addr + len)` in one live allocation, its
    /// context checked for a sticky error.
    fn device_range(&self, addr: u64, len: usize, api: &str) -> Result<usize, CuError> {
        let end = addr.saturating_add(len as u64);
        let Some(dev) = device_of(addr).filter(|&d| d < self.device_count()) else {
            return Err(CuError::new(
                ErrorCode::InvalidValue,
                format!("{api}: {addr:#x} is not a device address"),
            ));
        };
        self.check_sticky(dev)?;
        match self.shared.memories[dev].lookup(addr, len as u64) {
            Ok(_) => Ok(dev),
            Err(e) => Err(CuError::new(
                ErrorCode::InvalidValue,
                format!(
                    "{api}: {addr:#x}..{end:#x} {} of device {dev}",
                    match e {
                        MemError::Freed => "lies in a freed allocation",
                        MemError::OutOfBounds => "is not inside a live allocation",
                    }
                ),
            )),
        }
    }

    fn stream_and_context(&self, s: StreamHandle) -> Result<Arc<StreamShared>, CuError> {
        let st = self.stream_of(s)?;
        self.check_sticky(st.dev)?;
        Ok(st)
    }

    /// The checks of a copy between host and device memory on `s`: the stream (and no
    /// sticky error), then `None` for nothing to copy (`len` 0), an error for a null host
    /// pointer (`host` names its side), and the device range at `dev`.
    fn host_copy_stream(
        &self,
        s: StreamHandle,
        len: usize,
        host_null: bool,
        host: &str,
        dev: u64,
        api: &'static str,
    ) -> Result<Option<Arc<StreamShared>>, CuError> {
        let st = self.stream_and_context(s)?;
        if len == 0 {
            return Ok(None);
        }
        if host_null {
            return Err(CuError::new(
                ErrorCode::InvalidValue,
                format!("{api}: null {host}"),
            ));
        }
        self.device_range(dev, len, api)?;
        Ok(Some(st))
    }

    /// `size` bytes of device memory on device `dev`, zero-filled (the bytes count as
    /// uninitialised for initcheck until written). Never reuses an address.
    pub fn mem_alloc(&self, dev: usize, size: usize) -> Result<u64, CuError> {
        self.live_device(dev)?;
        self.check_unsafe_call("cuMemAlloc")?;
        self.shared.memories[dev].alloc(size)
    }

    /// Frees an allocation from [`mem_alloc`](Driver::mem_alloc); later accesses to it
    /// are use-after-free faults. On a poisoned context the memory is released and the
    /// sticky error returned.
    pub fn mem_free(&self, ptr: u64) -> Result<(), CuError> {
        let Some(dev) = device_of(ptr).filter(|&d| d < self.device_count()) else {
            return Err(CuError::new(
                ErrorCode::InvalidValue,
                format!("cuMemFree: {ptr:#x} is not a device address"),
            ));
        };
        self.check_unsafe_call("cuMemFree")?;
        self.shared.memories[dev].free(ptr)?;
        self.check_sticky(dev)
    }

    /// `size` bytes of pinned host memory, zeroed and page-aligned.
    pub fn mem_alloc_host(&self, size: usize) -> Result<*mut u8, CuError> {
        self.check_unsafe_call("cuMemAllocHost")?;
        self.shared.pinned.alloc(size)
    }

    /// Frees pinned memory from [`mem_alloc_host`](Driver::mem_alloc_host) (waiting for
    /// a copy that is using it at this moment).
    pub fn mem_free_host(&self, p: *mut u8) -> Result<(), CuError> {
        self.check_unsafe_call("cuMemFreeHost")?;
        self.shared.pinned.free(p)
    }

    /// Copies `src` to device memory on the legacy NULL stream of `dst`'s device.
    /// From pageable memory: synchronises the legacy stream, stages the bytes and
    /// returns without waiting for them to land (non-blocking streams may overtake the
    /// copy). From pinned memory: returns once the copy completed.
    pub fn memcpy_htod(&self, dst: u64, src: &[u8]) -> Result<(), CuError> {
        const API: &str = "cuMemcpyHtoD";
        if src.is_empty() {
            return Ok(());
        }
        let dev = self.device_range(dst, src.len(), API)?;
        self.check_legacy_use(dev, API)?;
        let legacy = Arc::clone(&self.shared.contexts[dev].legacy);
        let op = Op::HtoD {
            dst,
            src: HostSrc::Staged(src.to_vec()),
            api: API,
        };
        if self.shared.pinned.contains(src.as_ptr(), src.len()) {
            let seq = self.enqueue(&legacy, Vec::new(), op)?;
            legacy.wait_for(seq);
        } else {
            for d in self.sync_targets(&legacy) {
                d.wait();
            }
            self.check_sticky(dev)?;
            self.enqueue(&legacy, Vec::new(), op)?;
        }
        self.check_sticky(dev)
    }

    /// Copies device memory to `dst` on the legacy NULL stream of `src`'s device and
    /// returns once the bytes arrived.
    pub fn memcpy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<(), CuError> {
        const API: &str = "cuMemcpyDtoH";
        if dst.is_empty() {
            return Ok(());
        }
        let dev = self.device_range(src, dst.len(), API)?;
        let legacy = Arc::clone(&self.shared.contexts[dev].legacy);
        let buf = Arc::new(Mutex::new(Vec::new()));
        let op = Op::DtoH {
            dst: HostDst::Staged(Arc::clone(&buf)),
            src,
            len: dst.len(),
            api: API,
        };
        let seq = self.enqueue(&legacy, Vec::new(), op)?;
        legacy.wait_for(seq);
        self.check_sticky(dev)?;
        let bytes = lock(&buf);
        if bytes.len() == dst.len() {
            dst.copy_from_slice(&bytes);
        }
        Ok(())
    }

    /// Sets `len` bytes at `dst` to `value` on the legacy NULL stream of `dst`'s
    /// device; returns at once (asynchronous with respect to the host).
    pub fn memset_d8(&self, dst: u64, value: u8, len: usize) -> Result<(), CuError> {
        const API: &str = "cuMemsetD8";
        if len == 0 {
            return Ok(());
        }
        let dev = self.device_range(dst, len, API)?;
        let legacy = Arc::clone(&self.shared.contexts[dev].legacy);
        let op = Op::Memset(Fill {
            dst,
            value,
            len,
            api: API,
        });
        self.enqueue(&legacy, Vec::new(), op).map(|_| ())
    }

    /// Enqueues a copy of `len` host bytes at `src` to `dst` on `s`. A pinned source is
    /// read when the copy executes; a pageable one is staged now.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes during the call and, if it is
    /// pinned memory, until the copy completed (or the block is freed: the copy then
    /// faults instead of reading it).
    pub unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        s: StreamHandle,
    ) -> Result<(), CuError> {
        const API: &str = "cuMemcpyHtoDAsync";
        let Some(st) = self.host_copy_stream(s, len, src.is_null(), "source", dst, API)? else {
            return Ok(());
        };
        let src = if self.shared.pinned.contains(src, len) {
            HostSrc::Pinned(HostPtr(src.cast_mut()), len)
        } else {
            // SAFETY: the caller guarantees `src` is valid for `len` bytes during the call.
            HostSrc::Staged(unsafe { std::slice::from_raw_parts(src, len) }.to_vec())
        };
        self.enqueue(&st, Vec::new(), Op::HtoD { dst, src, api: API })
            .map(|_| ())
    }

    /// Enqueues a copy of `len` device bytes at `src` to host memory `dst` on `s`. Into
    /// pinned memory it is written when the copy executes; into pageable memory the
    /// call waits for the copy to complete.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes during the call and, if it is
    /// pinned memory, until the copy completed, and not be accessed in between.
    pub unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        s: StreamHandle,
    ) -> Result<(), CuError> {
        const API: &str = "cuMemcpyDtoHAsync";
        let Some(st) = self.host_copy_stream(s, len, dst.is_null(), "destination", src, API)?
        else {
            return Ok(());
        };
        if self.shared.pinned.contains(dst, len) {
            let op = Op::DtoH {
                dst: HostDst::Pinned(HostPtr(dst)),
                src,
                len,
                api: API,
            };
            return self.enqueue(&st, Vec::new(), op).map(|_| ());
        }
        let buf = Arc::new(Mutex::new(Vec::new()));
        let op = Op::DtoH {
            dst: HostDst::Staged(Arc::clone(&buf)),
            src,
            len,
            api: API,
        };
        let seq = self.enqueue(&st, Vec::new(), op)?;
        st.wait_for(seq);
        self.check_sticky(st.dev)?;
        let bytes = lock(&buf);
        if bytes.len() == len {
            // SAFETY: the caller guarantees `dst` is valid for writes of `len` bytes
            // during the call; `bytes` is our own buffer of that length.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, len) };
        }
        Ok(())
    }

    /// Enqueues a device-to-device copy on `s` (the ranges may be on any devices).
    pub fn memcpy_dtod_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        s: StreamHandle,
    ) -> Result<(), CuError> {
        const API: &str = "cuMemcpyDtoDAsync";
        let st = self.stream_and_context(s)?;
        if len == 0 {
            return Ok(());
        }
        let src_dev = self.device_range(src, len, API)?;
        let dst_dev = self.device_range(dst, len, API)?;
        let op = self.dtod_op(API, dst, dst_dev, src, src_dev, len);
        self.enqueue(&st, Vec::new(), op).map(|_| ())
    }

    /// The copy, or the injected failure of a copy between two devices.
    fn dtod_op(
        &self,
        api: &'static str,
        dst: u64,
        dst_dev: usize,
        src: u64,
        src_dev: usize,
        len: usize,
    ) -> Op {
        let injected = (src_dev != dst_dev)
            .then(|| {
                self.take_injected(
                    InjectedError::PeerCopy,
                    |d| d == src_dev || d == dst_dev,
                    &format!(
                        "{api} of {len} bytes from device {src_dev} to device {dst_dev} hit an uncorrectable link error"
                    ),
                )
            })
            .flatten();
        match injected {
            Some(e) => Op::Fail(e),
            None => Op::DtoD(DeviceCopy { dst, src, len, api }),
        }
    }

    /// Enqueues a copy from device `src_dev`'s memory to device `dst_dev`'s on `s`.
    /// Works with or without peer access (the driver stages it).
    pub fn memcpy_peer_async(
        &self,
        dst: u64,
        dst_dev: usize,
        src: u64,
        src_dev: usize,
        len: usize,
        s: StreamHandle,
    ) -> Result<(), CuError> {
        const API: &str = "cuMemcpyPeerAsync";
        let st = self.stream_and_context(s)?;
        self.live_device(dst_dev)?;
        self.live_device(src_dev)?;
        if len == 0 {
            return Ok(());
        }
        for (addr, want, what) in [(src, src_dev, "source"), (dst, dst_dev, "destination")] {
            let dev = self.device_range(addr, len, API)?;
            if dev != want {
                return Err(CuError::new(
                    ErrorCode::InvalidValue,
                    format!("{API}: the {what} {addr:#x} is memory of device {dev}, not {want}"),
                ));
            }
        }
        let op = self.dtod_op(API, dst, dst_dev, src, src_dev, len);
        self.enqueue(&st, Vec::new(), op).map(|_| ())
    }

    /// Enqueues a byte fill of `len` bytes at `dst` on `s`.
    pub fn memset_d8_async(
        &self,
        dst: u64,
        value: u8,
        len: usize,
        s: StreamHandle,
    ) -> Result<(), CuError> {
        const API: &str = "cuMemsetD8Async";
        let st = self.stream_and_context(s)?;
        if len == 0 {
            return Ok(());
        }
        self.device_range(dst, len, API)?;
        let op = Op::Memset(Fill {
            dst,
            value,
            len,
            api: API,
        });
        self.enqueue(&st, Vec::new(), op).map(|_| ())
    }
}
