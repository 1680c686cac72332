//! Criterion benchmarks of the CPU backend at SmolLM2-135M shapes (K-quant mul_mat at
//! Gemma 3 270M's).
//!
//! `cargo bench -p ggml-cpu -- --quick` runs them briefly, `-- mul_mat_id` only the
//! mixture-of-experts products. Throughput is reported in elements per second where one
//! element is one floating-point operation (mul_mat: `2·N·K·M`, mul_mat_id:
//! `2·n_used·T·K·M`) or one byte moved (rms_norm, rope, soft_max: bytes read + written).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ggml_core::{AttnParams, Backend, Context, DType, DataRef, RopeParams, Tensor, TensorId};
use ggml_cpu::{CpuBackend, CpuBackendOptions, Isa};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Random bytes for a tensor: f32 values, or quant blocks with small finite scales.
fn fill(t: &Tensor, rng: &mut Rng) -> Vec<u8> {
    let n = t.nbytes();
    match t.dtype {
        DType::F32 => (0..n / 4).flat_map(|_| rng.f().to_le_bytes()).collect(),
        DType::I32 => (0..n / 4).flat_map(|i| (i as i32).to_le_bytes()).collect(),
        d => {
            let ts = d.type_size();
            let mut v: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            let scales: &[usize] = match d {
                DType::Q4_1 | DType::Q4K | DType::Q5K => &[0, 2],
                DType::Q2K => &[80, 82],
                DType::Q3K => &[108],
                DType::Q6K => &[208],
                _ => &[0],
            };
            for b in v.chunks_exact_mut(ts) {
                for &o in scales {
                    let h = half::f16::from_f32(rng.f() * 0.01).to_bits();
                    b[o..o + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
            v
        }
    }
}

/// A one-op graph placed in one buffer of `be`, inputs filled.
struct Graph {
    tensors: Vec<Tensor>,
    out: TensorId,
}

fn setup(be: &CpuBackend, build: impl Fn(&mut Context<'_>) -> TensorId) -> Graph {
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 16];
    let mut ctx = Context::new(&mut storage);
    let out = build(&mut ctx);
    let mut tensors = ctx.tensors().to_vec();
    let total: usize = tensors.iter().map(|t| t.nbytes().div_ceil(64) * 64).sum();
    let buf = be.alloc_buffer(total).unwrap();
    let mut off = 0u64;
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for t in tensors.iter_mut() {
        t.data = Some(DataRef {
            buffer: buf.id,
            addr: buf.base + off,
        });
        off += (t.nbytes().div_ceil(64) * 64) as u64;
        if t.op == ggml_core::Op::None {
            be.set_tensor_async(t, 0, &fill(t, &mut rng)).unwrap();
        }
    }
    be.synchronize().unwrap();
    Graph { tensors, out }
}

fn run(be: &CpuBackend, g: &Graph) {
    be.graph_compute(&g.tensors, &[g.out]).unwrap();
    be.synchronize().unwrap();
}

/// The backend under test: `GGML_CPU_BENCH_THREADS` threads (default: all cores) at the
/// instruction-set level named by `GGML_CPU_BENCH_ISA` (default: the best available).
fn backend() -> CpuBackend {
    let mut o = CpuBackendOptions::default();
    if let Some(n) = std::env::var("GGML_CPU_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        o.n_threads = n;
    }
    if let Ok(name) = std::env::var("GGML_CPU_BENCH_ISA") {
        let isa = Isa::available().into_iter().find(|i| i.name() == name);
        o.isa = Some(isa.unwrap_or_else(|| {
            let names: Vec<_> = Isa::available().iter().map(|i| i.name()).collect();
            panic!("GGML_CPU_BENCH_ISA={name}: not one of the available {names:?}")
        }));
    }
    CpuBackend::new(o).unwrap()
}

fn mul_mat(c: &mut Criterion) {
    let be = backend();
    let mut group = c.benchmark_group(format!("mul_mat/{}x{}t", be.isa(), be.n_threads()));
    group.sample_size(10);
    group.warm_up_time(std::time::Duration::from_millis(300));
    group.measurement_time(std::time::Duration::from_secs(2));
    for w in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0] {
        for (n, k, m) in [
            (1, 576, 1536),
            (512, 576, 1536),
            (1, 576, 49152),
            (512, 576, 49152),
            // test-backend-ops perf's shape, for a side-by-side with llama.cpp.
            (1, 14336, 4096),
            (512, 14336, 4096),
            // Gemma 3 270M's gate/up (Q5_0 in its Q4_K_M file): the panel tiles at K = 640.
            (512, 640, 2048),
        ] {
            let g = setup(&be, |ctx| {
                let a = ctx.new_tensor(w, [k, m, 1, 1]).unwrap();
                let b = ctx.new_tensor(DType::F32, [k, n, 1, 1]).unwrap();
                ctx.mul_mat(a, b).unwrap()
            });
            group.throughput(Throughput::Elements((2 * n * k * m) as u64));
            group.bench_with_input(
                BenchmarkId::new(w.name(), format!("{n}x{k}x{m}")),
                &g,
                |bch, g| bch.iter(|| run(&be, black_box(g))),
            );
        }
    }
    // K-quants at Gemma 3 270M's ffn_down shape (its Q4_K_M file has Q4_K and Q6_K
    // there; 640-wide rows are not a multiple of 256, so only K = 1024 and 2048 are
    // K-quants).
    for w in [DType::Q4K, DType::Q6K, DType::Q5K, DType::Q3K, DType::Q2K] {
        for (n, k, m) in [(1, 2048, 640), (512, 2048, 640)] {
            let g = setup(&be, |ctx| {
                let a = ctx.new_tensor(w, [k, m, 1, 1]).unwrap();
                let b = ctx.new_tensor(DType::F32, [k, n, 1, 1]).unwrap();
                ctx.mul_mat(a, b).unwrap()
            });
            group.throughput(Throughput::Elements((2 * n * k * m) as u64));
            group.bench_with_input(
                BenchmarkId::new(w.name(), format!("{n}x{k}x{m}")),
                &g,
                |bch, g| bch.iter(|| run(&be, black_box(g))),
            );
        }
    }
    group.finish();
}

/// MUL_MAT_ID at the MoE FFN shapes of SmolLM2 upcycled to 4 experts with 2 used per
/// token: up/gate (`[576, 1536]` per expert, one row of `b` per token) and down
/// (`[1536, 576]` per expert, one row of `b` per chosen expert), for a 512-token prompt
/// and one token, next to a dense mul_mat of the same arithmetic (and, for one token, the
/// same weight bytes). Routing: a fixed pseudo-random top-2 of 4 per token.
fn mul_mat_id(c: &mut Criterion) {
    let be = backend();
    let mut group = c.benchmark_group(format!("mul_mat_id/{}x{}t", be.isa(), be.n_threads()));
    group.sample_size(10);
    group.warm_up_time(std::time::Duration::from_millis(300));
    group.measurement_time(std::time::Duration::from_secs(2));
    let (n_as, n_used) = (4usize, 2usize);
    let cases = [
        ("up", DType::Q4_1, 576, 1536, 1),
        ("up", DType::Q8_0, 576, 1536, 1),
        ("down", DType::Q4_1, 1536, 576, n_used),
        ("down", DType::Q8_0, 1536, 576, n_used),
        ("down", DType::Q6K, 1536, 576, n_used),
    ];
    for (name, w, k, m, b1) in cases {
        for n_tok in [512usize, 1] {
            let g = setup(&be, |ctx| {
                let a = ctx.new_tensor(w, [k, m, n_as, 1]).unwrap();
                let b = ctx.new_tensor(DType::F32, [k, b1, n_tok, 1]).unwrap();
                let ids = ctx.new_tensor(DType::I32, [n_used, n_tok, 1, 1]).unwrap();
                ctx.mul_mat_id(a, b, ids).unwrap()
            });
            let mut rng = Rng(0x2545_f491_4f6c_dd1d);
            let ids: Vec<u8> = (0..n_tok)
                .flat_map(|_| {
                    let first = (rng.next() % n_as as u64) as i32;
                    let second =
                        (first + 1 + (rng.next() % (n_as as u64 - 1)) as i32) % n_as as i32;
                    [first, second]
                })
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let id = g.tensors[g.out.index()].src[2].unwrap();
            be.set_tensor_async(&g.tensors[id.index()], 0, &ids)
                .unwrap();
            be.synchronize().unwrap();
            let flops = (2 * n_used * n_tok * k * m) as u64;
            group.throughput(Throughput::Elements(flops));
            group.bench_with_input(
                BenchmarkId::new(format!("{}/{name}", w.name()), format!("t{n_tok}")),
                &g,
                |bch, g| bch.iter(|| run(&be, black_box(g))),
            );
            // The same work: for a prompt, one expert's matrix times every (slot, token)
            // column; for one token, the chosen experts' rows stacked times its column.
            let (dm, dn) = match n_tok {
                1 => (n_used * m, 1),
                _ => (m, n_used * n_tok),
            };
            let dense = setup(&be, |ctx| {
                let a = ctx.new_tensor(w, [k, dm, 1, 1]).unwrap();
                let b = ctx.new_tensor(DType::F32, [k, dn, 1, 1]).unwrap();
                ctx.mul_mat(a, b).unwrap()
            });
            group.bench_with_input(
                BenchmarkId::new(format!("{}/{name}-dense", w.name()), format!("t{n_tok}")),
                &dense,
                |bch, g| bch.iter(|| run(&be, black_box(g))),
            );
        }
    }
    group.finish();
}

fn row_ops(c: &mut Criterion) {
    let be = backend();
    let mut group = c.benchmark_group(format!("rows/{}x{}t", be.isa(), be.n_threads()));
    group.sample_size(20);
    group.warm_up_time(std::time::Duration::from_millis(200));
    group.measurement_time(std::time::Duration::from_secs(1));
    let n_tok = 512;
    let g = setup(&be, |ctx| {
        let x = ctx.new_tensor(DType::F32, [576, n_tok, 1, 1]).unwrap();
        ctx.rms_norm(x, 1e-5).unwrap()
    });
    group.throughput(Throughput::Bytes((2 * 4 * 576 * n_tok) as u64));
    group.bench_function("rms_norm/576x512", |bch| bch.iter(|| run(&be, &g)));
    let g = setup(&be, |ctx| {
        let x = ctx.new_tensor(DType::F32, [64, 9, n_tok, 1]).unwrap();
        let pos = ctx.new_tensor(DType::I32, [n_tok, 1, 1, 1]).unwrap();
        ctx.rope(x, pos, RopeParams::llama(64, 100000.0)).unwrap()
    });
    group.throughput(Throughput::Bytes((2 * 4 * 64 * 9 * n_tok) as u64));
    group.bench_function("rope/64x9x512", |bch| bch.iter(|| run(&be, &g)));
    let g = setup(&be, |ctx| {
        let x = ctx.new_tensor(DType::F32, [n_tok, n_tok, 9, 1]).unwrap();
        let m = ctx.new_tensor(DType::F32, [n_tok, n_tok, 1, 1]).unwrap();
        ctx.soft_max(x, Some(m), 0.125, 0.0).unwrap()
    });
    group.throughput(Throughput::Bytes((2 * 4 * n_tok * n_tok * 9) as u64));
    group.bench_function("soft_max/512x512x9", |bch| bch.iter(|| run(&be, &g)));
    // Gemma 3's GEGLU at generation: one row, cut between the threads.
    let g = setup(&be, |ctx| {
        let x = ctx.new_tensor(DType::F32, [2048, 1, 1, 1]).unwrap();
        let y = ctx.new_tensor(DType::F32, [2048, 1, 1, 1]).unwrap();
        ctx.geglu(x, y).unwrap()
    });
    group.throughput(Throughput::Bytes((3 * 4 * 2048) as u64));
    group.bench_function("geglu/2048x1", |bch| bch.iter(|| run(&be, &g)));
    group.finish();
}

/// FLASH_ATTN_EXT at SmolLM2's shapes (head size 64, 9 query and 3 KV heads) and Gemma 3
/// 270M's (head size 256, 4 query heads on 1 KV head), F16 K/V and causal mask: a
/// 512-token prompt, and one token after 511.
fn attention(c: &mut Criterion) {
    let be = backend();
    let mut group = c.benchmark_group(format!("attn/{}x{}t", be.isa(), be.n_threads()));
    group.sample_size(10);
    group.warm_up_time(std::time::Duration::from_millis(300));
    group.measurement_time(std::time::Duration::from_secs(2));
    let n_kv = 512;
    for ((d, n_head, n_kv_head), n_q) in [(64, 9, 3), (256, 4, 1)]
        .into_iter()
        .flat_map(|s| [(s, 512), (s, 1)])
    {
        let g = setup(&be, |ctx| {
            let q = ctx.new_tensor(DType::F32, [d, n_q, n_head, 1]).unwrap();
            let k = ctx.new_tensor(DType::F16, [d, n_kv, n_kv_head, 1]).unwrap();
            let v = ctx.new_tensor(DType::F16, [d, n_kv, n_kv_head, 1]).unwrap();
            let m = ctx.new_tensor(DType::F16, [n_kv, n_q, 1, 1]).unwrap();
            let scale = 1.0 / (d as f32).sqrt();
            ctx.flash_attn_ext(q, k, v, Some(m), AttnParams::scaled(scale))
                .unwrap()
        });
        // Query iq sees positions 0..=n_kv-n_q+iq.
        let visible = |iq: usize, j: usize| j <= n_kv - n_q + iq;
        let mask: Vec<u8> = (0..n_q * n_kv)
            .flat_map(|i| {
                let v = if visible(i / n_kv, i % n_kv) {
                    0.0
                } else {
                    f32::NEG_INFINITY
                };
                half::f16::from_f32(v).to_bits().to_le_bytes()
            })
            .collect();
        let m = g.tensors[g.out.index()].src[3].unwrap();
        be.set_tensor_async(&g.tensors[m.index()], 0, &mask)
            .unwrap();
        be.synchronize().unwrap();
        let pairs: usize = (0..n_q).map(|iq| n_kv - n_q + iq + 1).sum();
        group.throughput(Throughput::Elements((4 * d * n_head * pairs) as u64));
        let name = format!("f16/d{d}h{n_head}kv{n_kv_head}/q{n_q}xkv{n_kv}");
        group.bench_function(name, |bch| bch.iter(|| run(&be, black_box(&g))));
    }
    group.finish();
}

criterion_group!(benches, mul_mat, mul_mat_id, row_ops, attention);
criterion_main!(benches);
