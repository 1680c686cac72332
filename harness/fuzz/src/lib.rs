//! The bodies of the harness's fuzz targets, as functions: the cargo-fuzz targets call
//! them, and `harness/tests/fuzz_seeds.rs` replays the committed seeds through them
//! (including this file by path), so every seed runs in CI without libFuzzer.

use std::sync::OnceLock;

use ggml_core::gguf::Gguf;
use ggml_core::DType;
use harness::devices::DeviceList;
use harness::gguf_writer::{GgufWriter, MetaValue};
use harness::kl::{ChunkLogProbs, KlBase};
use harness::synthetic::{synthetic_gguf, SyntheticSpec};
use harness::tokenizer::Tokenizer;

/// Any bytes as a matrix file: a matrix, or a one-line error `m.toml:LINE: reason` with
/// LINE inside the text (or the line after its last newline, for an error at the end).
/// A panic is a finding.
pub fn matrix_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = harness::matrix::file::parse("m.toml", None, text) {
        let e = e.to_string();
        assert!(!e.contains('\n'), "{e:?}");
        let line: usize = e
            .strip_prefix("m.toml:")
            .and_then(|r| r.split(':').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no line in {e:?}"));
        assert!(line >= 1 && line <= text.lines().count() + 1, "{e:?}");
    }
}

/// Any text as a `--devices` list: a list that prints back to itself, or a one-line
/// error. A panic is a finding.
pub fn devices_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match text.parse::<DeviceList>() {
        Ok(list) => {
            let again: DeviceList = list.to_string().parse().expect("printed lists parse");
            assert_eq!(again.to_string(), list.to_string());
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
    }
}

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let bytes = synthetic_gguf(&SyntheticSpec::tiny(DType::Q4_0));
        Tokenizer::from_gguf(&Gguf::parse(&bytes).expect("synthetic GGUF parses"))
            .expect("synthetic vocabulary loads")
    })
}

/// Any text through the synthetic model's byte-level BPE tokenizer: it encodes, with and
/// without special tokens, and decoding gives the text back. A panic is a finding.
pub fn tokenizer_text(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let tok = tokenizer();
    let ids = tok.encode_with(&text, false);
    assert_eq!(tok.decode(&ids), text);
    let _ = tok.encode(&text);
}

/// The fuzzed input of [`gguf_roundtrip`]: metadata entries (key, value selector,
/// number, string, numbers) and tensors (name, two dimension seeds).
pub type RoundtripInput = (
    Vec<(String, u8, u32, String, Vec<i32>)>,
    Vec<(String, u8, u8)>,
);

/// GGUF files the harness writes (from fuzzed metadata and tensor shapes), read back by
/// ggml-core's parser: every key, value, shape and byte comes back as written.
pub fn gguf_roundtrip(input: RoundtripInput) {
    let (kvs, tensors) = input;
    let mut kvs: Vec<(String, MetaValue)> = kvs
        .into_iter()
        .map(|(k, sel, n, s, v)| {
            let value = match sel % 8 {
                0 => MetaValue::U32(n),
                1 => MetaValue::I32(n as i32),
                2 => MetaValue::F32(f32::from_bits(n)),
                3 => MetaValue::Bool(n & 1 == 1),
                4 => MetaValue::Str(s),
                5 => MetaValue::StrArray(s.split(',').map(str::to_string).collect()),
                6 => MetaValue::F32Array(v.iter().map(|&x| f32::from_bits(x as u32)).collect()),
                _ => MetaValue::I32Array(v),
            };
            (k, value)
        })
        .collect();
    kvs.sort_by(|a, b| a.0.cmp(&b.0));
    kvs.dedup_by(|a, b| a.0 == b.0);
    let mut tensors: Vec<(String, u64, u64)> = tensors
        .into_iter()
        .map(|(name, a, b)| (name, a as u64 % 17 + 1, b as u64 % 5 + 1))
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors.dedup_by(|a, b| a.0 == b.0);
    let data =
        |i: usize, n: u64| -> Vec<u8> { (0..n * 4).map(|b| (b as usize * 7 + i) as u8).collect() };

    let mut w = GgufWriter::new();
    for (k, v) in &kvs {
        w.meta(k, v.clone());
    }
    for (i, (name, n0, n1)) in tensors.iter().enumerate() {
        w.tensor(name, DType::F32, &[*n0, *n1], data(i, n0 * n1));
    }
    let bytes = match w.to_bytes() {
        Ok(b) => b,
        Err(e) => {
            // What the writer refuses is what readers would: a bad alignment, an
            // overlong tensor name.
            let bad_alignment = kvs.iter().any(|(k, v)| {
                k == "general.alignment" && !matches!(v, MetaValue::U32(a) if a.is_power_of_two())
            });
            let long_name = tensors
                .iter()
                .any(|(n, ..)| n.len() > ggml_core::gguf::MAX_TENSOR_NAME_LEN);
            assert!(
                (bad_alignment && e.contains("general.alignment"))
                    || (long_name && e.contains("limit")),
                "{e}"
            );
            return;
        }
    };
    let g = Gguf::parse(&bytes).unwrap_or_else(|e| panic!("the writer's file does not parse: {e}"));
    assert_eq!(g.metadata_count(), kvs.len());
    for (k, v) in &kvs {
        match v {
            MetaValue::U32(x) => assert_eq!(g.get_u32(k), Some(*x)),
            MetaValue::I32(x) => assert_eq!(g.get_i32(k), Some(*x)),
            MetaValue::F32(x) => assert_eq!(g.get_f32(k).map(f32::to_bits), Some(x.to_bits())),
            MetaValue::Bool(x) => assert_eq!(g.get_bool(k), Some(*x)),
            MetaValue::Str(x) => assert_eq!(g.get_str(k), Some(x.as_str())),
            MetaValue::StrArray(x) => {
                let got: Vec<&str> = g
                    .get_array(k)
                    .and_then(|a| a.strings())
                    .expect("strings")
                    .collect();
                assert_eq!(got, x.iter().map(String::as_str).collect::<Vec<_>>());
            }
            MetaValue::I32Array(x) => {
                let got: Vec<i32> = g
                    .get_array(k)
                    .and_then(|a| a.numbers::<i32>())
                    .expect("i32s")
                    .collect();
                assert_eq!(&got, x);
            }
            MetaValue::F32Array(x) => {
                let got: Vec<u32> = g
                    .get_array(k)
                    .and_then(|a| a.numbers::<f32>())
                    .expect("f32s")
                    .map(f32::to_bits)
                    .collect();
                assert_eq!(got, x.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            }
        }
    }
    assert_eq!(g.tensor_count(), tensors.len());
    for (i, (name, n0, n1)) in tensors.iter().enumerate() {
        let t = g.tensor(name).expect("tensor");
        assert_eq!(t.dims(), &[*n0, *n1][..]);
        assert_eq!(g.tensor_data(&t), Some(&data(i, n0 * n1)[..]));
    }
}

/// Any bytes as a llama-perplexity KL-divergence base file: opened, checked against a
/// run, and read chunk by chunk, or a one-line error naming the file. A panic is a
/// finding.
pub fn kl_base(data: &[u8]) {
    let src = Box::new(std::io::Cursor::new(data.to_vec()));
    let mut base = match KlBase::from_source("base.kld", src) {
        Ok(b) => b,
        Err(e) => {
            let e = e.to_string();
            assert!(!e.contains('\n') && e.starts_with("base.kld: "), "{e:?}");
            return;
        }
    };
    // A run that may or may not match the header.
    let tokens: Vec<u32> = data.iter().take(64).map(|&b| u32::from(b)).collect();
    if let Err(e) = base.check_run(16, 256, &tokens) {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
    let mut out = ChunkLogProbs::default();
    for c in 0..4 {
        if let Err(e) = base.read_chunk(c, &mut out) {
            assert!(!e.to_string().contains('\n'), "{e}");
            break;
        }
    }
}
