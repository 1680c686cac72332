//! Placing weights and the KV cache in backend memory.

use std::sync::Arc;

use ggml_core::{Backend, BufferId, BufferInfo, DType, DataRef, Tensor, TensorId};

use crate::error::{ModelError, Result};
use crate::gguf_file::GgufFile;
use crate::model::Model;

/// A buffer that is freed when dropped.
pub struct OwnedBuffer {
    backend: Arc<dyn Backend>,
    info: BufferInfo,
}

impl std::fmt::Debug for OwnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "OwnedBuffer({} bytes on {})",
            self.info.size,
            self.backend.name()
        )
    }
}

impl OwnedBuffer {
    /// Allocates `size` bytes on `backend`.
    pub fn alloc(backend: &Arc<dyn Backend>, size: usize) -> Result<OwnedBuffer> {
        let info = backend.alloc_buffer(size.max(1))?;
        Ok(OwnedBuffer {
            backend: backend.clone(),
            info,
        })
    }

    /// Takes ownership of a buffer `backend` created.
    pub fn from_info(backend: &Arc<dyn Backend>, info: BufferInfo) -> OwnedBuffer {
        OwnedBuffer {
            backend: backend.clone(),
            info,
        }
    }

    /// The buffer's handle, base address and size.
    pub fn info(&self) -> BufferInfo {
        self.info
    }

    /// The data location of byte `offset`.
    pub fn at(&self, offset: usize) -> DataRef {
        DataRef {
            buffer: self.info.id,
            addr: self.info.base + offset as u64,
        }
    }

    /// The id of the buffer.
    pub fn id(&self) -> BufferId {
        self.info.id
    }
}

impl Drop for OwnedBuffer {
    fn drop(&mut self) {
        // Never free bytes a kernel may still read: a scheduler that gave up on a device
        // leaves its queue running. If the queue does not drain within a second the
        // buffer is left allocated (a leak is safe, a free under a kernel is not).
        if matches!(
            self.backend
                .synchronize_timeout(std::time::Duration::from_secs(1)),
            Ok(false)
        ) {
            return;
        }
        // Nothing useful can be done about a failure while dropping; the backend logs it.
        let _ = self.backend.free_buffer(self.info.id);
    }
}

/// Which device (index into the backend list) holds each layer, and the embeddings and
/// output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerMap {
    /// Device of each layer.
    pub layer_device: Vec<usize>,
    /// Device of `token_embd` lookups (the input side).
    pub input_device: usize,
    /// Device of the output norm and output matrix.
    pub output_device: usize,
    /// The cut of every layer over the devices (`--split-mode tensor`), if any.
    pub tp: Option<std::sync::Arc<crate::model::TpShards>>,
}

impl LayerMap {
    /// Every layer on device 0.
    pub fn single(n_layer: usize) -> LayerMap {
        LayerMap {
            layer_device: vec![0; n_layer],
            input_device: 0,
            output_device: 0,
            tp: None,
        }
    }

    /// Layers spread over `n_devices` in equal shares (llama.cpp's default
    /// `--tensor-split`); embeddings on the first device, output on the last.
    pub fn even(n_layer: usize, n_devices: usize) -> Result<LayerMap> {
        LayerMap::proportional(n_layer, &vec![1.0; n_devices])
    }

    /// Layers spread over devices in proportion to `shares` (llama.cpp's
    /// `--tensor-split`); embeddings on the first device, output on the last.
    pub fn proportional(n_layer: usize, shares: &[f32]) -> Result<LayerMap> {
        let n_devices = shares.len();
        if n_devices == 0 {
            return Err(ModelError::Usage("no devices to split layers over".into()));
        }
        let ranges = ggml_sched::split_layers(n_layer, shares)?;
        let mut layer_device = vec![0; n_layer];
        for (dev, r) in ranges.iter().enumerate() {
            for l in r.clone() {
                layer_device[l] = dev;
            }
        }
        Ok(LayerMap {
            layer_device,
            input_device: 0,
            output_device: n_devices - 1,
            tp: None,
        })
    }

    /// Tensor parallelism over `tp.n_dev` devices: embeddings and output on the first.
    pub fn tensor_parallel(n_layer: usize, tp: crate::model::TpShards) -> LayerMap {
        LayerMap {
            tp: Some(std::sync::Arc::new(tp)),
            ..LayerMap::single(n_layer)
        }
    }

    /// The device of weight `id` of `model` (`None`: not used, not placed).
    pub fn device_of(&self, model: &Model, id: TensorId) -> Option<usize> {
        if let Some(tp) = &self.tp {
            return tp.weight_device.get(id.index()).copied().flatten();
        }
        Some(match model.layer_of(id) {
            Some(l) => self.layer_device[l],
            None if id == model.tok_embd => self.input_device,
            None => self.output_device,
        })
    }
}

/// Places every weight of `model` on its device: in place in the memory-mapped file
/// where the backend can read host memory, else copied into a device buffer. Returns the
/// buffers to keep alive as long as the weights are used.
pub fn place_weights(
    model: &mut Model,
    file: &GgufFile,
    backends: &[Arc<dyn Backend>],
    map: &LayerMap,
) -> Result<Vec<OwnedBuffer>> {
    let mut buffers = Vec::new();
    let base = file.bytes().as_ptr() as u64;
    for (dev, backend) in backends.iter().enumerate() {
        let mine: Vec<usize> = (0..model.weights.len())
            .filter(|&i| map.device_of(model, TensorId(i as u32)) == Some(dev))
            .collect();
        if mine.is_empty() {
            continue;
        }
        if let Some(info) = backend.buffer_from_host_ptr(base, file.bytes().len())? {
            let buf = OwnedBuffer::from_info(backend, info);
            for &i in &mine {
                model.weights[i].data = Some(buf.at(model.file_ranges[i].start));
            }
            buffers.push(buf);
            continue;
        }
        // Descriptors of the same bytes (a tied output) share one upload per device.
        let align = backend.alignment().max(1);
        let mut offsets = Vec::with_capacity(mine.len());
        let mut first_of: Vec<(usize, usize)> = Vec::new();
        let mut size = 0usize;
        for &i in &mine {
            let start = model.file_ranges[i].start;
            match first_of.iter().find(|(s, _)| *s == start) {
                Some(&(_, off)) => offsets.push((off, false)),
                None => {
                    first_of.push((start, size));
                    offsets.push((size, true));
                    size += model.file_ranges[i].len().div_ceil(align) * align;
                }
            }
        }
        let buf = OwnedBuffer::alloc(backend, size)?;
        for (&i, &(off, upload)) in mine.iter().zip(&offsets) {
            if upload {
                backend.buffer_set(buf.id(), off, &file.bytes()[model.file_ranges[i].clone()])?;
            }
            model.weights[i].data = Some(buf.at(off));
        }
        buffers.push(buf);
    }
    Ok(buffers)
}

/// The KV cache: F16 keys and values of every layer for `size` cells, in each layer's
/// device, plus the position and sequence of each cell.
pub struct KvCache {
    /// Per layer: key and value descriptors with data.
    pub layers: Vec<(Tensor, Tensor)>,
    /// Cells available.
    pub size: usize,
    /// Position held by each cell (`None` when empty).
    pub cell_pos: Vec<Option<(i32, u32)>>,
    /// With tensor parallelism: per layer, per device, the keys and values of that
    /// device's KV heads (`layers` is then unused).
    pub tp_layers: Vec<Vec<(Tensor, Tensor)>>,
    /// The model's sliding window (0: none): its local layers see only the cells of the
    /// `n_swa` latest positions.
    pub n_swa: usize,
    _buffers: Vec<OwnedBuffer>,
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KvCache({} layers x {} cells)",
            self.layers.len(),
            self.size
        )
    }
}

impl KvCache {
    /// Cell bookkeeping without tensors (for tests of batch preparation).
    #[cfg(test)]
    pub(crate) fn cells_only(size: usize) -> KvCache {
        KvCache {
            layers: Vec::new(),
            size,
            cell_pos: vec![None; size],
            tp_layers: Vec::new(),
            n_swa: 0,
            _buffers: Vec::new(),
        }
    }

    /// Allocates a zeroed cache of `size` cells (rounded up to a multiple of 256).
    pub fn new(
        model: &Model,
        backends: &[Arc<dyn Backend>],
        map: &LayerMap,
        size: usize,
    ) -> Result<KvCache> {
        let size = size.div_ceil(256) * 256;
        if let Some(tp) = &map.tp {
            return KvCache::new_tp(model, backends, tp, size);
        }
        let hp = &model.hp;
        let proto = Tensor::contiguous(DType::F16, [hp.n_embd_kv(), size, 1, 1])
            .ok_or_else(|| ModelError::Usage(format!("KV cache of {size} cells is too large")))?;
        let bytes = proto.nbytes();
        let mut buffers = Vec::new();
        let mut layers = vec![(proto, proto); hp.n_layer];
        for (dev, backend) in backends.iter().enumerate() {
            let mine: Vec<usize> = (0..hp.n_layer)
                .filter(|&l| map.layer_device[l] == dev)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let align = backend.alignment().max(1);
            let stride = bytes.div_ceil(align) * align;
            let buf = OwnedBuffer::alloc(backend, stride * 2 * mine.len())?;
            backend.buffer_clear(buf.id(), 0)?;
            for (j, &l) in mine.iter().enumerate() {
                let (k, v) = &mut layers[l];
                k.data = Some(buf.at(2 * j * stride));
                k.name = ggml_core::name!("cache_k_l{l}");
                v.data = Some(buf.at((2 * j + 1) * stride));
                v.name = ggml_core::name!("cache_v_l{l}");
            }
            buffers.push(buf);
        }
        Ok(KvCache {
            layers,
            size,
            cell_pos: vec![None; size],
            tp_layers: Vec::new(),
            n_swa: hp.n_swa,
            _buffers: buffers,
        })
    }

    /// The cache cut by KV heads as `tp` cuts attention: device `d` holds its heads of
    /// every layer.
    fn new_tp(
        model: &Model,
        backends: &[Arc<dyn Backend>],
        tp: &crate::model::TpShards,
        size: usize,
    ) -> Result<KvCache> {
        let hp = &model.hp;
        let too_big = || ModelError::Usage(format!("KV cache of {size} cells is too large"));
        let mut tp_layers = vec![Vec::with_capacity(tp.n_dev); hp.n_layer];
        let mut buffers = Vec::new();
        for (d, backend) in backends.iter().enumerate().take(tp.n_dev) {
            let heads = tp.kv_heads[d].len().max(1);
            let proto = Tensor::contiguous(DType::F16, [hp.head_dim * heads, size, 1, 1])
                .ok_or_else(too_big)?;
            let named = |l: usize| {
                let (mut k, mut v) = (proto, proto);
                k.name = ggml_core::name!("cache_k_l{l}#{d}");
                v.name = ggml_core::name!("cache_v_l{l}#{d}");
                (k, v)
            };
            if tp.kv_heads[d].is_empty() {
                // No heads here: descriptors only, never read.
                for (l, row) in tp_layers.iter_mut().enumerate() {
                    row.push(named(l));
                }
                continue;
            }
            let align = backend.alignment().max(64);
            let stride = proto.nbytes().div_ceil(align) * align;
            let buf = OwnedBuffer::alloc(backend, 2 * stride * hp.n_layer)?;
            backend.buffer_clear(buf.id(), 0)?;
            for (l, row) in tp_layers.iter_mut().enumerate() {
                let (mut k, mut v) = named(l);
                k.data = Some(buf.at(2 * l * stride));
                v.data = Some(buf.at((2 * l + 1) * stride));
                row.push((k, v));
            }
            buffers.push(buf);
        }
        Ok(KvCache {
            layers: Vec::new(),
            size,
            cell_pos: vec![None; size],
            tp_layers,
            n_swa: hp.n_swa,
            _buffers: buffers,
        })
    }

    /// Forgets every cell (the bytes stay; masks exclude empty cells).
    pub fn clear(&mut self) {
        self.cell_pos.fill(None);
    }
}
