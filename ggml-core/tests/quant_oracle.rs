//! Bit-exactness of ggml-core's quantisation against outside oracles.
//!
//! `tests/data/quant_vectors.bin` holds, per dtype, seeded input rows with the quantised
//! bytes and dequantised f32 bits that llama.cpp's own C code (ggml-quants.c, compiled
//! without FMA) produced for them, cross-checked against the `gguf` Python package where
//! it implements the type, plus dequantize-only cases on random block bytes. See
//! `tests/data/gen_quant_vectors.py` for the format and how to regenerate the file.

use ggml_core::quant::{self, QuantBlock};
use ggml_core::DType;
use rstest::rstest;

const VECTORS: &[u8] = include_bytes!("data/quant_vectors.bin");

const FLAG_Q_C: u8 = 1;
const FLAG_DQ_C: u8 = 2;
const FLAG_Q_GGUF: u8 = 4;
const FLAG_DQ_GGUF: u8 = 8;
const FLAG_DQ_ONLY: u8 = 16;

struct Case {
    dtype_id: u32,
    name: String,
    flags: u8,
    input: Option<Vec<f32>>,
    quantized: Vec<u8>,
    dequantized: Vec<f32>,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        s
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn f32s(&mut self) -> Vec<f32> {
        let n = self.u32() as usize;
        self.take(4 * n)
            .chunks_exact(4)
            .map(|b| f32::from_bits(u32::from_le_bytes(b.try_into().unwrap())))
            .collect()
    }
}

fn load() -> Vec<Case> {
    let mut r = Reader {
        buf: VECTORS,
        pos: 0,
    };
    assert_eq!(r.take(4), b"GGQV", "bad magic");
    assert_eq!(r.u32(), 2, "unknown vector file version");
    let n_inputs = r.u32() as usize;
    let inputs: Vec<Vec<f32>> = (0..n_inputs).map(|_| r.f32s()).collect();
    let n_cases = r.u32() as usize;
    let mut cases = Vec::with_capacity(n_cases);
    for _ in 0..n_cases {
        let dtype_id = r.u32();
        let name_len = r.u8() as usize;
        let name = String::from_utf8(r.take(name_len).to_vec()).unwrap();
        let flags = r.u8();
        let input_index = r.u32();
        let input = (input_index != u32::MAX).then(|| inputs[input_index as usize].clone());
        let nq = r.u32() as usize;
        let quantized = r.take(nq).to_vec();
        let dequantized = r.f32s();
        cases.push(Case {
            dtype_id,
            name,
            flags,
            input,
            quantized,
            dequantized,
        });
    }
    assert_eq!(r.pos, VECTORS.len(), "trailing bytes in vector file");
    cases
}

/// Where `got` and `want` differ (as bits), formatted for the first few.
fn diff<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("length {} != {}", got.len(), want.len()));
    }
    let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    if bad.is_empty() {
        return None;
    }
    let shown: Vec<String> = bad
        .iter()
        .take(6)
        .map(|&i| format!("[{i}] got {:?} want {:?}", got[i], want[i]))
        .collect();
    Some(format!(
        "{} of {} differ: {}",
        bad.len(),
        got.len(),
        shown.join(", ")
    ))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Quantize and dequantize through the typed block API too, to cover it directly.
fn typed_round_trip<B: QuantBlock>(input: &[f32], want_q: &[u8], want_dq: &[f32]) -> Vec<String> {
    let mut errors = Vec::new();
    let mut blocks = vec![B::zeroed(); input.len() / B::BLOCK_SIZE];
    B::quantize_row(input, &mut blocks).unwrap();
    if let Some(d) = diff(bytemuck::cast_slice::<B, u8>(&blocks), want_q) {
        errors.push(format!("typed quantize: {d}"));
    }
    let oracle_blocks: Vec<B> = want_q
        .chunks_exact(std::mem::size_of::<B>())
        .map(bytemuck::pod_read_unaligned)
        .collect();
    let mut y = vec![0.0f32; want_dq.len()];
    B::dequantize_row(&oracle_blocks, &mut y).unwrap();
    if let Some(d) = diff(&bits(&y), &bits(want_dq)) {
        errors.push(format!("typed dequantize: {d}"));
    }
    errors
}

fn typed(dtype: DType, input: &[f32], q: &[u8], dq: &[f32]) -> Vec<String> {
    match dtype {
        DType::Q4_0 => typed_round_trip::<quant::BlockQ4_0>(input, q, dq),
        DType::Q4_1 => typed_round_trip::<quant::BlockQ4_1>(input, q, dq),
        DType::Q5_0 => typed_round_trip::<quant::BlockQ5_0>(input, q, dq),
        DType::Q5_1 => typed_round_trip::<quant::BlockQ5_1>(input, q, dq),
        DType::Q8_0 => typed_round_trip::<quant::BlockQ8_0>(input, q, dq),
        DType::Q8_1 => typed_round_trip::<quant::BlockQ8_1>(input, q, dq),
        DType::Q2K => typed_round_trip::<quant::BlockQ2K>(input, q, dq),
        DType::Q3K => typed_round_trip::<quant::BlockQ3K>(input, q, dq),
        DType::Q4K => typed_round_trip::<quant::BlockQ4K>(input, q, dq),
        DType::Q5K => typed_round_trip::<quant::BlockQ5K>(input, q, dq),
        DType::Q6K => typed_round_trip::<quant::BlockQ6K>(input, q, dq),
        DType::Q8K => typed_round_trip::<quant::BlockQ8K>(input, q, dq),
        _ => Vec::new(),
    }
}

/// `oracles`: the flags every quantize case of this dtype must carry (which oracles
/// produced or confirmed it); dequantize-only cases must carry the dequantize part.
#[rstest]
#[case::f32(DType::F32, FLAG_Q_GGUF | FLAG_DQ_GGUF)]
#[case::f16(DType::F16, FLAG_Q_C | FLAG_DQ_C | FLAG_Q_GGUF | FLAG_DQ_GGUF)]
#[case::bf16(DType::BF16, FLAG_Q_C | FLAG_DQ_C | FLAG_Q_GGUF | FLAG_DQ_GGUF)]
#[case::q4_0(DType::Q4_0, FLAG_Q_C | FLAG_DQ_C | FLAG_Q_GGUF | FLAG_DQ_GGUF)]
#[case::q4_1(DType::Q4_1, FLAG_Q_C | FLAG_DQ_C | FLAG_Q_GGUF | FLAG_DQ_GGUF)]
#[case::q5_0(DType::Q5_0, FLAG_Q_C | FLAG_DQ_C | FLAG_Q_GGUF | FLAG_DQ_GGUF)]
#[case::q5_1(DType::Q5_1, FLAG_Q_C | FLAG_DQ_C | FLAG_Q_GGUF | FLAG_DQ_GGUF)]
#[case::q8_0(DType::Q8_0, FLAG_Q_C | FLAG_DQ_C | FLAG_Q_GGUF | FLAG_DQ_GGUF)]
#[case::q8_1(DType::Q8_1, FLAG_Q_C | FLAG_DQ_C)]
#[case::q2_k(DType::Q2K, FLAG_Q_C | FLAG_DQ_C | FLAG_DQ_GGUF)]
#[case::q3_k(DType::Q3K, FLAG_Q_C | FLAG_DQ_C | FLAG_DQ_GGUF)]
#[case::q4_k(DType::Q4K, FLAG_Q_C | FLAG_DQ_C | FLAG_DQ_GGUF)]
#[case::q5_k(DType::Q5K, FLAG_Q_C | FLAG_DQ_C | FLAG_DQ_GGUF)]
#[case::q6_k(DType::Q6K, FLAG_Q_C | FLAG_DQ_C | FLAG_DQ_GGUF)]
#[case::q8_k(DType::Q8K, FLAG_Q_C | FLAG_DQ_C)]
fn bit_exact_with_oracle(#[case] dtype: DType, #[case] oracles: u8) {
    let cases: Vec<Case> = load()
        .into_iter()
        .filter(|c| c.dtype_id == dtype.ggml_id())
        .collect();
    let n_quant = cases.iter().filter(|c| c.input.is_some()).count();
    assert!(
        n_quant >= 15,
        "{dtype}: only {n_quant} quantize cases in the vector file"
    );
    if dtype != DType::F32 {
        assert!(
            cases.iter().any(|c| c.flags & FLAG_DQ_ONLY != 0),
            "{dtype}: no dequantize-only case"
        );
    }

    let mut failures = Vec::new();
    for case in &cases {
        let want = if case.input.is_some() {
            oracles
        } else {
            (oracles & (FLAG_DQ_C | FLAG_DQ_GGUF)) | FLAG_DQ_ONLY
        };
        assert_eq!(
            case.flags & want,
            want,
            "{}: flags {:#x}",
            case.name,
            case.flags
        );

        if let Some(input) = &case.input {
            let mut q = vec![0u8; dtype.row_size(input.len()).unwrap()];
            quant::quantize_row(dtype, input, &mut q).unwrap();
            if let Some(d) = diff(&q, &case.quantized) {
                failures.push(format!("{}: quantize: {d}", case.name));
            }
            for e in typed(dtype, input, &case.quantized, &case.dequantized) {
                failures.push(format!("{}: {e}", case.name));
            }
        }
        let mut y = vec![0.0f32; case.dequantized.len()];
        quant::dequantize_row(dtype, &case.quantized, &mut y).unwrap();
        if let Some(d) = diff(&bits(&y), &bits(&case.dequantized)) {
            failures.push(format!("{}: dequantize: {d}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{dtype}: {} mismatches with the oracle:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every dtype but I32 has vectors (the case table above lists them all).
#[test]
fn every_dtype_has_vectors() {
    let cases = load();
    for dtype in ggml_core::ALL_DTYPES {
        let n = cases
            .iter()
            .filter(|c| c.dtype_id == dtype.ggml_id())
            .count();
        if dtype == DType::I32 {
            assert_eq!(n, 0);
        } else {
            assert!(n > 0, "{dtype}: no vectors");
        }
    }
}

/// The quantisers that round (Q8_0 and Q8_1 with `roundf`, half away from zero) meet
/// exact halves in the `ties` case, so a quantiser rounding them another way (half to
/// even, say) differs from the oracle there.
#[test]
fn ties_reach_the_q8_rounding() {
    let cases = load();
    for dtype in [DType::Q8_0, DType::Q8_1] {
        let case = cases
            .iter()
            .find(|c| c.dtype_id == dtype.ggml_id() && c.name.ends_with("/ties"))
            .unwrap_or_else(|| panic!("{dtype}: no ties case"));
        let input = case.input.as_ref().expect("a quantize case");
        let mut halves = 0;
        for block in input.chunks(32) {
            let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let id = 127.0 / amax;
            halves += block
                .iter()
                .filter(|x| {
                    let v = *x * id;
                    v.fract().abs() == 0.5 && v.round() != v.round_ties_even()
                })
                .count();
        }
        assert!(
            halves >= 16,
            "{dtype}: only {halves} ties where rounding modes differ"
        );
    }
}
