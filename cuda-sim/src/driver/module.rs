//! Modules (parsed PTX), their functions, and kernel launches.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::ops::{LaunchOp, Op};
use super::stream::panic_text;
use super::{lock, read, write, Driver, FunctionHandle, InjectedError, ModuleHandle, StreamHandle};
use crate::error::{CuError, ErrorCode};
use crate::exec::LaunchConfig;
use crate::ptx::{self, Param};

/// Dynamic shared memory a kernel may use without raising its limit (48 KiB).
pub const DEFAULT_MAX_DYNAMIC_SHARED: u32 = 48 << 10;
/// The most shared memory per block of the emulated sm_80 (227 KiB).
pub const MAX_SHARED_PER_BLOCK: u32 = 227 << 10;
/// The most threads per block.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// Largest block dimensions.
pub const MAX_BLOCK_DIM: [u32; 3] = [1024, 1024, 64];
/// Largest grid dimensions.
pub const MAX_GRID_DIM: [u32; 3] = [i32::MAX as u32, 65535, 65535];

/// A loaded module.
pub(crate) struct LoadedModule {
    pub(crate) dev: usize,
    pub(crate) file: String,
    pub(crate) module: ptx::Module,
    /// Kernel name -> function handle, so a kernel has one handle.
    functions: Mutex<HashMap<String, u64>>,
}

/// A kernel of a loaded module.
pub(crate) struct LoadedFunction {
    pub(crate) module: Arc<LoadedModule>,
    module_id: u64,
    name: String,
    params: Vec<Param>,
    max_dynamic_shared: AtomicU32,
}

fn invalid(detail: String) -> CuError {
    CuError::new(ErrorCode::InvalidValue, detail)
}

impl Driver {
    fn module_of(&self, m: ModuleHandle) -> Result<Arc<LoadedModule>, CuError> {
        read(&self.modules)
            .get(&m.0)
            .cloned()
            .ok_or_else(|| CuError::new(ErrorCode::InvalidHandle, format!("no module {}", m.0)))
    }

    fn function_of(&self, f: FunctionHandle) -> Result<Arc<LoadedFunction>, CuError> {
        read(&self.functions)
            .get(&f.0)
            .cloned()
            .ok_or_else(|| CuError::new(ErrorCode::InvalidHandle, format!("no function {}", f.0)))
    }

    /// Parses `ptx` (named `file` in errors and fault reports) into a module of device
    /// `dev`, as `cuModuleLoadDataEx` JIT-compiles it. A PTX error is
    /// `CUDA_ERROR_INVALID_PTX` with the parser's message (file, line, what).
    pub fn module_load(&self, dev: usize, file: &str, ptx: &str) -> Result<ModuleHandle, CuError> {
        self.live_device(dev)?;
        let parsed = catch_unwind(AssertUnwindSafe(|| ptx::Module::parse(file, ptx)));
        let module = match parsed {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => return Err(CuError::new(ErrorCode::InvalidPtx, e.to_string())),
            Err(p) => {
                return Err(CuError::new(
                    ErrorCode::InvalidPtx,
                    format!("{file}: the PTX parser panicked: {}", panic_text(&*p)),
                ))
            }
        };
        let (major, minor) = self.shared.cfg.compute_capability;
        let device_sm = (major * 10 + minor) as u32;
        if module.target_sm() > device_sm {
            return Err(CuError::new(
                ErrorCode::InvalidPtx,
                format!(
                    "{file}: .target sm_{} is newer than the device (sm_{device_sm})",
                    module.target_sm()
                ),
            ));
        }
        let id = self.next_id();
        let m = LoadedModule {
            dev,
            file: file.to_string(),
            module,
            functions: Mutex::new(HashMap::new()),
        };
        write(&self.modules).insert(id, Arc::new(m));
        Ok(ModuleHandle(id))
    }

    /// Unloads a module; its function handles become invalid. Launches already
    /// enqueued still run.
    pub fn module_unload(&self, m: ModuleHandle) -> Result<(), CuError> {
        let module = write(&self.modules)
            .remove(&m.0)
            .ok_or_else(|| CuError::new(ErrorCode::InvalidHandle, format!("no module {}", m.0)))?;
        write(&self.functions).retain(|_, f| f.module_id != m.0);
        self.check_sticky(module.dev)
    }

    /// The kernel (`.entry`) `name` of module `m`; `CUDA_ERROR_NOT_FOUND` if there is
    /// none. Asking twice gives the same handle.
    pub fn module_function(&self, m: ModuleHandle, name: &str) -> Result<FunctionHandle, CuError> {
        let module = self.module_of(m)?;
        self.check_sticky(module.dev)?;
        let mut known = lock(&module.functions);
        if let Some(&id) = known.get(name) {
            return Ok(FunctionHandle(id));
        }
        let params = module.module.kernel_params(name).ok_or_else(|| {
            CuError::new(
                ErrorCode::NotFound,
                format!("no kernel {name} in module {}", module.file),
            )
        })?;
        let id = self.next_id();
        let f = LoadedFunction {
            module: Arc::clone(&module),
            module_id: m.0,
            name: name.to_string(),
            params: params.to_vec(),
            max_dynamic_shared: AtomicU32::new(DEFAULT_MAX_DYNAMIC_SHARED),
        };
        write(&self.functions).insert(id, Arc::new(f));
        known.insert(name.to_string(), id);
        Ok(FunctionHandle(id))
    }

    /// The kernel's parameters, in declaration order.
    pub fn function_params(&self, f: FunctionHandle) -> Result<Vec<Param>, CuError> {
        Ok(self.function_of(f)?.params.clone())
    }

    /// Raises (or lowers) the dynamic shared memory the kernel may be launched with
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`); above 227 KiB is
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub fn function_set_max_dynamic_shared(
        &self,
        f: FunctionHandle,
        bytes: u32,
    ) -> Result<(), CuError> {
        let func = self.function_of(f)?;
        self.check_sticky(func.module.dev)?;
        if bytes > MAX_SHARED_PER_BLOCK {
            return Err(invalid(format!(
                "max dynamic shared memory {bytes} bytes: the device has {MAX_SHARED_PER_BLOCK} per block"
            )));
        }
        func.max_dynamic_shared.store(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Enqueues kernel `f` on stream `s` over `grid` blocks of `block` threads with
    /// `shared` bytes of dynamic shared memory. `args` holds one value per parameter,
    /// each exactly the parameter's size; they are copied at the call. Invalid launches
    /// (dimensions, shared memory, arguments) are `CUDA_ERROR_INVALID_VALUE` at the
    /// call; faults in the kernel poison the context when it runs.
    pub fn launch(
        &self,
        f: FunctionHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        s: StreamHandle,
        args: &[&[u8]],
    ) -> Result<(), CuError> {
        self.launch_ex(f, grid, block, shared, s, args, false)
    }

    /// [`launch`](Driver::launch) as `cuLaunchKernelEx`, with programmatic stream
    /// serialisation when `programmatic` (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`,
    /// sm_90 and newer; `CUDA_ERROR_NOT_SUPPORTED` on an older device): the grid may start
    /// before the one before it on the stream has finished, and must run
    /// `griddepcontrol.wait` before it touches global memory (racecheck checks this; the
    /// grids still run one after the other here). Captured into a graph, the flag stays
    /// with the kernel node.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_ex(
        &self,
        f: FunctionHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        s: StreamHandle,
        args: &[&[u8]],
        programmatic: bool,
    ) -> Result<(), CuError> {
        let func = self.function_of(f)?;
        let st = self.stream_of(s)?;
        if func.module.dev != st.dev {
            return Err(CuError::new(
                ErrorCode::InvalidHandle,
                format!(
                    "kernel {} of device {} launched on a stream of device {}",
                    func.name, func.module.dev, st.dev
                ),
            ));
        }
        self.check_sticky(st.dev)?;
        let name = &func.name;
        if programmatic && self.shared.cfg.compute_capability.0 < 9 {
            return Err(CuError::new(
                ErrorCode::NotSupported,
                format!(
                    "launch of {name}: programmatic stream serialisation needs sm_90 or newer \
                     (the device is sm_{}{})",
                    self.shared.cfg.compute_capability.0, self.shared.cfg.compute_capability.1
                ),
            ));
        }
        for (axis, ((&g, &b), (&gmax, &bmax))) in grid
            .iter()
            .zip(&block)
            .zip(MAX_GRID_DIM.iter().zip(&MAX_BLOCK_DIM))
            .enumerate()
        {
            let axis = ["x", "y", "z"][axis];
            if g == 0 || g > gmax {
                return Err(invalid(format!(
                    "launch of {name}: grid {axis} dimension {g} (1 to {gmax})"
                )));
            }
            if b == 0 || b > bmax {
                return Err(invalid(format!(
                    "launch of {name}: block {axis} dimension {b} (1 to {bmax})"
                )));
            }
        }
        let threads = block.iter().map(|&b| b as u64).product::<u64>();
        if threads > MAX_THREADS_PER_BLOCK as u64 {
            return Err(invalid(format!(
                "launch of {name}: {threads} threads per block (at most {MAX_THREADS_PER_BLOCK})"
            )));
        }
        let max_shared = func.max_dynamic_shared.load(Ordering::Relaxed);
        if shared > max_shared {
            return Err(invalid(format!(
                "launch of {name}: {shared} bytes of dynamic shared memory, the kernel's limit is \
                 {max_shared} (raise it with function_set_max_dynamic_shared)"
            )));
        }
        if args.len() != func.params.len() {
            return Err(invalid(format!(
                "launch of {name}: {} arguments for {} parameters",
                args.len(),
                func.params.len()
            )));
        }
        for (i, (a, p)) in args.iter().zip(&func.params).enumerate() {
            if a.len() != p.size {
                return Err(invalid(format!(
                    "launch of {name}: argument {i} ({}) has {} bytes, the parameter {}",
                    p.name,
                    a.len(),
                    p.size
                )));
            }
        }
        let on_dev = |d: usize| d == st.dev;
        let what = format!("kernel {name} of {}", func.module.file);
        if let Some(e) = self.take_injected(
            InjectedError::Launch,
            on_dev,
            &format!("cuLaunchKernel of {what}"),
        ) {
            return Err(e);
        }
        let op = match self.take_injected(
            InjectedError::IllegalAddress,
            on_dev,
            &format!("{what} accessed an illegal address"),
        ) {
            Some(e) => Op::Fail(e),
            None => Op::Launch(Box::new(LaunchOp {
                module: Arc::clone(&func.module),
                kernel: name.clone(),
                cfg: LaunchConfig {
                    grid,
                    block,
                    dynamic_shared: shared,
                    programmatic,
                },
                args: args.iter().map(|a| a.to_vec()).collect(),
                stamp: self.shared.profile.stamp(st.id),
            })),
        };
        self.enqueue(&st, Vec::new(), op)?;
        Ok(())
    }
}
