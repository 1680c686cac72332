//! CUDA graphs of splits: the key that says two `graph_compute` calls launch exactly the
//! same kernels with the same arguments, and the per-backend cache of captured graphs.
//!
//! A split's kernels and their arguments are a function of what the key holds: every
//! node's op and op parameters (bit for bit), dtype, shape, strides, data address and
//! buffer, the dtype, shape, strides, address and buffer of each of its sources, the
//! fusion plan's steps, the tuning, the scratch buffer and the batched upload folded into
//! the split, and the names that its kernels' errors carry. Equal keys therefore replay
//! the same graph; keys are compared word for word.
//!
//! The first time a key is seen the split runs eagerly and the key is remembered; the
//! second time its launches are captured into a graph, which is then launched; after
//! that only the graph is launched. The cache holds [`MAX_GRAPHS`] keys and evicts the
//! least recently used one.
//!
//! Splits with a product of the tiled (prompt) class are never keyed or captured
//! ([`prompt_sized`]): their kernels each run far longer than a launch takes, so launched
//! one by one the host stays ahead of the GPU, while a key costs host time before the
//! first launch and a capture a few milliseconds. On the H200 (run 5 in
//! `harness/reference/cuda-h200.md`) pp512 ran at 100.8-104.2k t/s without graphs and at
//! 89.4-93.2k with them, 54.7k on the pass that captured.

use std::collections::HashMap;

use ggml_core::{Name, Op, RopeMode, Tensor, TensorId};

use crate::driver::GraphExec;
use crate::fusion::Step;
use crate::host_counters::GraphTally;
use crate::kernels::KernelId;
use crate::launch::MulMatClass;
use crate::CudaTuning;

/// Keys (seen once or captured) one backend keeps: every split a device runs per token,
/// for every pipeline slot (a tensor split cuts a model into dozens per device).
pub(crate) const MAX_GRAPHS: usize = 512;

/// Words of a key, built into a reusable buffer.
#[derive(Default)]
pub(crate) struct KeyBuilder {
    words: Vec<u64>,
    /// `seen[i] == build_id`: tensor `i` is a node already in the key being built.
    seen: Vec<u32>,
    build_id: u32,
}

/// FNV-1a over bytes (names).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

impl KeyBuilder {
    fn f(&mut self, x: f32) {
        self.words.push(x.to_bits() as u64);
    }

    /// The op and its parameters, floats bit for bit.
    fn op(&mut self, op: &Op) {
        let w = &mut self.words;
        match *op {
            Op::None => w.push(0),
            Op::GetRows => w.push(1),
            Op::Add => w.push(2),
            Op::Mul => w.push(3),
            Op::Div => w.push(4),
            Op::Scale { scale } => {
                w.push(5);
                self.f(scale);
            }
            Op::RmsNorm { eps } => {
                w.push(6);
                self.f(eps);
            }
            Op::MulMat => w.push(7),
            Op::MulMatId => w.push(8),
            Op::ArgsortTopK { k } => w.extend([9, k as u64]),
            Op::SumRows => w.push(10),
            Op::Argmax => w.push(27),
            Op::Clamp { min, max } => {
                w.push(11);
                self.f(min);
                self.f(max);
            }
            Op::Rope(p) => {
                let mode = match p.mode {
                    RopeMode::Normal => 0,
                    RopeMode::Neox => 1,
                };
                w.extend([12, mode, p.n_dims as u64, p.n_ctx_orig as u64]);
                for x in [
                    p.freq_base,
                    p.freq_scale,
                    p.ext_factor,
                    p.attn_factor,
                    p.beta_fast,
                    p.beta_slow,
                ] {
                    self.f(x);
                }
            }
            Op::SoftMax { scale, max_bias } => {
                w.push(13);
                self.f(scale);
                self.f(max_bias);
            }
            Op::Cpy => w.push(14),
            Op::SetRows => w.push(15),
            Op::Cont => w.push(16),
            Op::View => w.push(17),
            Op::Reshape => w.push(18),
            Op::Permute { axes } => w.extend([19, u32::from_le_bytes(axes) as u64]),
            Op::Transpose => w.push(20),
            Op::Silu => w.push(21),
            Op::Swiglu => w.push(22),
            Op::Gelu => w.push(23),
            Op::Geglu => w.push(24),
            Op::Concat { dim } => w.extend([25, dim as u64]),
            Op::FlashAttnExt {
                scale,
                max_bias,
                softcap,
            } => {
                w.push(26);
                self.f(scale);
                self.f(max_bias);
                self.f(softcap);
            }
            // An op added to ggml-core after this list: its Debug text, which writes
            // every parameter (floats by their shortest round-trip decimal).
            #[allow(unreachable_patterns)]
            _ => w.extend([u64::MAX, fnv(format!("{op:?}").as_bytes())]),
        }
    }

    /// What a launch reads of a tensor: dtype, shape, strides, data address and buffer.
    fn operand(&mut self, t: &Tensor) {
        self.words.push(t.dtype as u64);
        self.words.extend(t.ne.map(|n| n as u64));
        self.words.extend(t.nb.map(|n| n as u64));
        match t.data {
            Some(d) => self.words.extend([
                (d.buffer.domain.0 as u64) << 32 | d.buffer.index as u64,
                d.addr,
            ]),
            None => self.words.push(u64::MAX),
        }
    }

    /// The key of computing `nodes` of `tensors` as `steps` under `tuning`, with the
    /// backend's `scratch` address and the `extra` words of a folded upload. `None` for
    /// ids out of range (the eager path reports those).
    ///
    /// Each node is its op, parameters and operand words, the name of a node with an
    /// error word (the name its errors carry), and each source's operand words, or, for a
    /// source that is an earlier node of the split (already in the key), its index.
    pub(crate) fn build(
        &mut self,
        tensors: &[Tensor],
        nodes: &[TensorId],
        steps: &[Step],
        tuning: &CudaTuning,
        scratch: u64,
        extra: &[u64],
    ) -> Option<&[u64]> {
        self.words.clear();
        self.build_id = self.build_id.wrapping_add(1).max(1);
        if self.seen.len() < tensors.len() {
            self.seen.resize(tensors.len(), 0);
        }
        let t = tuning;
        let bits = [
            t.graphs,
            t.fuse_norm,
            t.fuse_qkv,
            t.fuse_rope_store,
            t.fuse_glu,
            t.fuse_add,
            t.legacy_products,
            t.legacy_decode_attn,
            t.fuse_qkv_rope,
            t.legacy_prompt_attn,
            t.qgemm,
            t.mma_attn,
            t.pdl,
            t.q8_window,
            t.attn_row_split,
            t.decode_lanes,
            t.row_attn,
            t.specialize,
            t.specialize_form,
        ];
        self.words.push(
            bits.iter()
                .enumerate()
                .fold(0, |a, (i, &b)| a | (b as u64) << i),
        );
        self.words.extend([scratch, extra.len() as u64]);
        self.words.extend_from_slice(extra);
        self.words.push(steps.len() as u64);
        for s in steps {
            match s {
                Step::Node(i) => self.words.extend([0, *i as u64]),
                Step::Fused { fusion, start, end } => {
                    let f = fnv(format!("{fusion:?}").as_bytes());
                    self.words.extend([1, f, *start as u64, *end as u64]);
                }
            }
        }
        for &id in nodes {
            let n = tensors.get(id.index())?;
            // The index, which later references to this node name.
            self.words.push(id.index() as u64);
            self.operand(n);
            self.op(&n.op);
            if matches!(n.op, Op::GetRows | Op::SetRows | Op::MulMatId) {
                self.words.push(fnv(n.name.as_str().as_bytes()));
            }
            for s in n.src {
                match s {
                    Some(s) if self.seen.get(s.index()) == Some(&self.build_id) => {
                        self.words.extend([u64::MAX - 2, s.index() as u64])
                    }
                    Some(s) => {
                        let st = tensors.get(s.index())?;
                        self.operand(st);
                    }
                    None => self.words.push(u64::MAX - 1),
                }
            }
            self.seen[id.index()] = self.build_id;
        }
        Some(&self.words)
    }
}

/// A graph captured for a key: what replaying it launches and which error words it
/// writes.
pub(crate) struct Captured {
    pub exec: GraphExec,
    /// Kernels, nodes and bytes per replay, for the host counters.
    pub tally: GraphTally,
    /// Launches per kernel per replay, for the kernel statistics.
    pub kernels: Vec<(KernelId, u64)>,
    /// Quantised products per replay in each class (matrix-vector, tiled), and its
    /// `qmm` variant launches.
    pub classes: [u64; 3],
    /// The class of the split's last quantised product, if any.
    pub last_class: Option<MulMatClass>,
    /// The error-word region its kernels write, and the op and node of each word.
    pub region: usize,
    pub users: Vec<(&'static str, Name)>,
    /// Replayed since the error words were last checked.
    pub armed: bool,
}

/// One remembered key.
pub(crate) struct Entry {
    key: Vec<u64>,
    last_use: u64,
    /// `None` until the key is seen a second time.
    pub captured: Option<Captured>,
}

/// Whether `nodes` hold a matrix product of the tiled class (at least
/// [`crate::launch::MMQ_MIN_N`] tokens): a prompt's split, which runs eagerly.
pub(crate) fn prompt_sized(tensors: &[Tensor], nodes: &[TensorId]) -> bool {
    nodes.iter().any(|&id| {
        let Some(t) = tensors.get(id.index()) else {
            return false;
        };
        let tokens = match t.op {
            Op::MulMat => t.ne[1],
            Op::MulMatId => t.ne[2],
            _ => return false,
        };
        crate::launch::mul_mat_class(tokens) == MulMatClass::Mmq
    })
}

/// A backend's keys and graphs.
#[derive(Default)]
pub(crate) struct GraphCache {
    /// Entries by slot (`None`: a free slot), so that indices stay valid.
    slots: Vec<Option<Entry>>,
    /// Slots by a hash of their key's ends.
    index: HashMap<u64, Vec<usize>>,
    clock: u64,
}

/// A hash of a key's length and its first and last words: the first node's index and
/// operands and the last's, which tell splits apart; equal hashes are compared whole.
fn quick_hash(key: &[u64]) -> u64 {
    const ENDS: usize = 64;
    let head = &key[..key.len().min(ENDS)];
    let tail = &key[key.len().saturating_sub(ENDS)..];
    std::iter::once(key.len() as u64)
        .chain(head.iter().copied())
        .chain(tail.iter().copied())
        .fold(0x9e37_79b9_7f4a_7c15, |h: u64, w| {
            (h ^ w).wrapping_mul(0xff51_afd7_ed55_8ccd).rotate_left(29)
        })
}

impl GraphCache {
    /// The slot of `key`, marked as used now.
    pub(crate) fn find(&mut self, key: &[u64]) -> Option<usize> {
        let slots = &self.slots;
        let i = *self
            .index
            .get(&quick_hash(key))?
            .iter()
            .find(|&&i| slots[i].as_ref().is_some_and(|e| e.key == key))?;
        self.clock += 1;
        let e = self.slots[i].as_mut().expect("indexed slots are full");
        e.last_use = self.clock;
        Some(i)
    }

    /// The entry in slot `i` (from [`GraphCache::find`]).
    pub(crate) fn entry(&mut self, i: usize) -> &mut Entry {
        self.slots[i].as_mut().expect("a slot from find")
    }

    fn remove(&mut self, i: usize) -> Option<Entry> {
        let e = self.slots[i].take()?;
        let h = quick_hash(&e.key);
        if let Some(v) = self.index.get_mut(&h) {
            v.retain(|&j| j != i);
            if v.is_empty() {
                self.index.remove(&h);
            }
        }
        Some(e)
    }

    /// Remembers `key` (seen once); the entry evicted to make room, if any.
    pub(crate) fn insert(&mut self, key: &[u64]) -> Option<Entry> {
        let used = self.slots.iter().filter(|e| e.is_some()).count();
        let evicted = match used >= MAX_GRAPHS {
            true => {
                let lru = (0..self.slots.len())
                    .filter(|&i| self.slots[i].is_some())
                    .min_by_key(|&i| self.slots[i].as_ref().map_or(0, |e| e.last_use));
                lru.and_then(|i| self.remove(i))
            }
            false => None,
        };
        self.clock += 1;
        let entry = Entry {
            key: key.to_vec(),
            last_use: self.clock,
            captured: None,
        };
        let i = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[i] = Some(entry);
        self.index.entry(quick_hash(key)).or_default().push(i);
        evicted
    }

    /// Removes every entry (their graphs are the caller's to destroy).
    pub(crate) fn take_all(&mut self) -> Vec<Entry> {
        self.index.clear();
        self.slots.drain(..).flatten().collect()
    }

    /// The captured graphs.
    pub(crate) fn captured_mut(&mut self) -> impl Iterator<Item = &mut Captured> {
        self.slots
            .iter_mut()
            .filter_map(|e| e.as_mut().and_then(|e| e.captured.as_mut()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_core::{BufferId, Context, DType, DataRef, MemoryDomain};

    fn key_of(tensors: &[Tensor], nodes: &[TensorId], tuning: CudaTuning) -> Vec<u64> {
        let steps: Vec<Step> = (0..nodes.len()).map(Step::Node).collect();
        let mut b = KeyBuilder::default();
        b.build(tensors, nodes, &steps, &tuning, 0x1000, &[])
            .unwrap()
            .to_vec()
    }

    #[test]
    fn the_key_sees_every_launch_input() {
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 16];
        let mut ctx = Context::new(&mut s);
        let a = ctx.new_tensor(DType::F32, [8, 2, 1, 1]).unwrap();
        let b = ctx.scale(a, 0.0).unwrap();
        let c = ctx.rms_norm(b, 1e-5).unwrap();
        let ids = ctx.new_tensor(DType::I32, [2, 1, 1, 1]).unwrap();
        let g = ctx.get_rows(c, ids).unwrap();
        let buf = BufferId {
            domain: MemoryDomain(7),
            index: 0,
        };
        let mut ts: Vec<Tensor> = ctx.tensors().to_vec();
        for (i, t) in ts.iter_mut().enumerate() {
            t.data = Some(DataRef {
                buffer: buf,
                addr: 0x10_0000 + 256 * i as u64,
            });
        }
        let nodes = [b, c, g];
        let base = key_of(&ts, &nodes, CudaTuning::default());
        assert_eq!(base, key_of(&ts, &nodes, CudaTuning::default()));
        let changed = |f: &dyn Fn(&mut Vec<Tensor>)| {
            let mut t2 = ts.clone();
            f(&mut t2);
            key_of(&t2, &nodes, CudaTuning::default())
        };
        // -0.0 and +0.0 scale to different bits.
        assert_ne!(
            base,
            changed(&|t| t[b.index()].op = Op::Scale { scale: -0.0 })
        );
        assert_ne!(
            base,
            changed(&|t| t[c.index()].op = Op::RmsNorm { eps: 1e-6 })
        );
        // A source's address, a node's shape, stride, dtype or name.
        assert_ne!(
            base,
            changed(&|t| t[a.index()].data.as_mut().unwrap().addr += 256)
        );
        assert_ne!(base, changed(&|t| t[c.index()].ne[1] = 1));
        assert_ne!(base, changed(&|t| t[c.index()].nb[2] += 4));
        assert_ne!(base, changed(&|t| t[a.index()].dtype = DType::F16));
        // The name errors carry; other names do not change the launches.
        assert_ne!(
            base,
            changed(&|t| t[g.index()].name = ggml_core::Name::new("other"))
        );
        assert_eq!(
            base,
            changed(&|t| t[c.index()].name = ggml_core::Name::new("other"))
        );
        // An earlier node as a source is referred to, not repeated: its change shows once.
        assert_ne!(base, changed(&|t| t[b.index()].nb[1] += 4));
        assert_ne!(
            base,
            changed(&|t| t[a.index()].data.as_mut().unwrap().buffer.index = 1)
        );
        assert_ne!(base, key_of(&ts, &nodes, CudaTuning::legacy()));
        // Every switch alone (a graph captured under one tuning is never replayed under
        // another).
        for item in CudaTuning::items().split(", ").filter(|i| i.contains('-')) {
            let t: CudaTuning = item.parse().unwrap();
            assert_ne!(base, key_of(&ts, &nodes, t), "{item}");
        }
        assert_ne!(base, key_of(&ts, &nodes[..1], CudaTuning::default()));
    }

    #[test]
    fn the_cache_evicts_the_least_recently_used_key() {
        let mut c = GraphCache::default();
        for k in 0..MAX_GRAPHS as u64 {
            assert!(c.insert(&[k]).is_none());
        }
        // Key 0 used again: key 1 is now the oldest.
        assert_eq!(c.find(&[0]), Some(0));
        assert!(c.find(&[0, 0]).is_none());
        let out = c.insert(&[999]).unwrap();
        assert_eq!(out.key, [1]);
        assert!(c.find(&[1]).is_none());
        assert!(c.find(&[0]).is_some());
        // The new key took the freed slot; every other key is still found.
        assert_eq!(c.find(&[999]), Some(1));
        for k in 2..MAX_GRAPHS as u64 {
            assert_eq!(c.find(&[k]), Some(k as usize));
        }
        assert_eq!(c.take_all().len(), MAX_GRAPHS);
        assert!(c.find(&[0]).is_none());
    }
}
