//! GGUF files the harness writes (from fuzzed metadata and tensor shapes), read back by
//! ggml-core's parser: every key, value, shape and byte comes back as written.
#![no_main]

use ggml_core::gguf::Gguf;
use ggml_core::DType;
use harness::gguf_writer::{GgufWriter, MetaValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (
    Vec<(String, u8, u32, String, Vec<i32>)>,
    Vec<(String, u8, u8)>
)| {
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
});
