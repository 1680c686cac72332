//! Valid GGUF files: values, arrays, tensors and layout rules.

mod common;

use common::{data_byte, sample, touch_all, Builder, TensorSpec, Val};
use ggml_core::gguf::{ErrorKind, Gguf, Value, ValueType};
use ggml_core::DType;

#[test]
fn sample_file() {
    let bytes = sample().build();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.metadata_count(), 7);
    assert_eq!(g.tensor_count(), 3);
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.data_offset() % 32, 0);
    assert_eq!(g.data_offset(), sample().header().len().div_ceil(32) * 32);
    assert_eq!(g.file_len(), bytes.len() as u64);

    assert_eq!(g.get_str("general.architecture"), Some("llama"));
    assert_eq!(g.get_u32("llama.block_count"), Some(2));
    assert_eq!(g.get_f32("llama.rope.freq_base"), Some(10000.0));
    assert_eq!(g.get_bool("general.flag"), Some(true));
    assert_eq!(g.get("missing"), None);
    assert_eq!(g.get_u32("general.architecture"), None);
    assert_eq!(g.get("llama.block_count"), Some(Value::U32(2)));

    // context_length is stored as i32: the exact u32 getter refuses, tolerant ones accept.
    assert_eq!(g.get_u32("llama.context_length"), None);
    assert_eq!(g.get_i32("llama.context_length"), Some(128));
    assert_eq!(g.get_as_u32("llama.context_length"), Some(128));
    assert_eq!(g.get_as_u64("llama.context_length"), Some(128));
    assert_eq!(g.get_as_usize("llama.block_count"), Some(2));
    assert_eq!(g.get_as_i64("llama.block_count"), Some(2));
    assert_eq!(g.get_as_u32("llama.rope.freq_base"), None);

    let tokens = g.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.elem_type(), ValueType::String);
    assert_eq!(tokens.len(), 3);
    let v: Vec<&str> = tokens.strings().unwrap().collect();
    assert_eq!(v, ["<s>", "a", "é"]);
    assert_eq!(tokens.get(2), Some(Value::String("é")));
    assert!(tokens.numbers::<f32>().is_none());

    let scores = g.get_array("tokenizer.ggml.scores").unwrap();
    let s: Vec<f32> = scores.numbers::<f32>().unwrap().collect();
    assert_eq!(s, [0.0, -1.5, 2.25]);
    assert_eq!(scores.get(1), Some(Value::F32(-1.5)));
    assert!(scores.numbers::<u32>().is_none());
    assert!(scores.strings().is_none());
    let mut buf = [0f32; 8];
    assert_eq!(scores.copy_into(&mut buf), Some(3));
    assert_eq!(buf[..3], [0.0, -1.5, 2.25]);

    let keys: Vec<&str> = g.metadata().map(|(k, _)| k).collect();
    assert_eq!(keys[0], "general.architecture");
    assert_eq!(keys.len(), 7);

    let names: Vec<&str> = g.tensors().map(|t| t.name()).collect();
    assert_eq!(
        names,
        [
            "token_embd.weight",
            "output_norm.weight",
            "blk.0.attn_q.weight"
        ]
    );
    let t = g.tensor("token_embd.weight").unwrap();
    assert_eq!(t.dtype(), DType::Q8_0);
    assert_eq!(t.dims(), [64, 3]);
    assert_eq!(t.ne(), [64, 3, 1, 1]);
    assert_eq!(t.n_elements(), 192);
    assert_eq!(t.n_bytes(), 2 * 34 * 3);
    assert_eq!(t.offset(), 0);
    let q = g.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.dtype(), DType::Q4K);
    assert_eq!(q.n_bytes(), 2 * 144);
    assert_eq!(q.index(), 2);
    assert!(g.tensor("nope").is_none());
    assert!(g.tensor_at(3).is_none());

    for t in g.tensors() {
        let data = t.data(&bytes);
        assert_eq!(data.len(), t.n_bytes());
        for (j, &b) in data.iter().enumerate() {
            assert_eq!(b, data_byte(t.index(), j));
        }
        assert_eq!(g.tensor_data(&t), Some(data));
    }
    g.check_packed_layout().unwrap();
    touch_all(&g, &bytes);
}

#[test]
fn version_2() {
    let mut b = sample();
    b.version = 2;
    let bytes = b.build();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version(), 2);
    touch_all(&g, &bytes);
}

#[test]
fn minimal_file_without_padding() {
    let bytes = Builder::new().header();
    assert_eq!(bytes.len(), 24);
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.metadata_count(), 0);
    assert_eq!(g.tensor_count(), 0);
    // The data section starts past the end of a file without tensors: allowed.
    assert_eq!(g.data_offset(), 32);
    assert_eq!(g.tensors().count(), 0);
    assert_eq!(g.metadata().count(), 0);
    g.check_packed_layout().unwrap();
}

#[test]
fn custom_alignment_is_honoured() {
    let mut b = sample().kv("general.alignment", Val::U32(64));
    b.alignment = 64;
    let bytes = b.build();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_offset() % 64, 0);
    assert!(g.tensors().all(|t| t.offset() % 64 == 0));
    g.check_packed_layout().unwrap();
    touch_all(&g, &bytes);

    // An offset aligned to 32 but not 64 is refused under alignment 64.
    let mut b = b.clone();
    b.tensors[1].offset = Some(256 + 32);
    let e = Gguf::parse(&b.build()).unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::MisalignedOffset {
            offset: 288,
            alignment: 64
        }
    );

    // Alignment 1 allows any offset.
    let mut b = sample().kv("general.alignment", Val::U32(1));
    b.alignment = 1;
    let bytes = b.build();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.data_offset(), b.header().len());
    g.check_packed_layout().unwrap();
}

#[test]
fn every_scalar_type() {
    let b = Builder::new()
        .kv("u8", Val::U8(200))
        .kv("i8", Val::I8(-100))
        .kv("u16", Val::U16(60000))
        .kv("i16", Val::I16(-30000))
        .kv("u32", Val::U32(4_000_000_000))
        .kv("i32", Val::I32(-2_000_000_000))
        .kv("u64", Val::U64(u64::MAX))
        .kv("i64", Val::I64(i64::MIN))
        .kv("f32", Val::F32(1.5))
        .kv("f64", Val::F64(-2.5))
        .kv("bool", Val::Bool(false))
        .kv("str", Val::Str(String::new()))
        .kv("", Val::Str("empty key".into()));
    let bytes = b.build();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.get("u8"), Some(Value::U8(200)));
    assert_eq!(g.get("i8"), Some(Value::I8(-100)));
    assert_eq!(g.get("u16"), Some(Value::U16(60000)));
    assert_eq!(g.get("i16"), Some(Value::I16(-30000)));
    assert_eq!(g.get("u32"), Some(Value::U32(4_000_000_000)));
    assert_eq!(g.get("i32"), Some(Value::I32(-2_000_000_000)));
    assert_eq!(g.get_u64("u64"), Some(u64::MAX));
    assert_eq!(g.get_i64("i64"), Some(i64::MIN));
    assert_eq!(g.get_f32("f32"), Some(1.5));
    assert_eq!(g.get_f64("f64"), Some(-2.5));
    assert_eq!(g.get_bool("bool"), Some(false));
    assert_eq!(g.get_str("str"), Some(""));
    assert_eq!(g.get_str(""), Some("empty key"));

    // Tolerant getters: any integer type whose value fits.
    assert_eq!(g.get_as_u32("u8"), Some(200));
    assert_eq!(g.get_as_i32("i16"), Some(-30000));
    assert_eq!(g.get_as_u32("i8"), None);
    assert_eq!(g.get_as_u32("u64"), None);
    assert_eq!(g.get_as_i64("u64"), None);
    assert_eq!(g.get_as_u64("u64"), Some(u64::MAX));
    assert_eq!(g.get_as_i64("i64"), Some(i64::MIN));
    assert_eq!(g.get_as_i32("u32"), None);
    assert_eq!(g.get_as_u32("bool"), None);
    assert_eq!(g.get_as_u32("f32"), None);
    touch_all(&g, &bytes);
}

#[test]
fn arrays_of_every_kind() {
    let b = Builder::new()
        .kv("empty", Val::Array(4, vec![]))
        .kv(
            "bools",
            Val::Array(7, vec![Val::Bool(true), Val::Bool(false)]),
        )
        .kv(
            "i32s",
            Val::Array(5, vec![Val::I32(-1), Val::I32(2), Val::I32(3)]),
        )
        .kv("u8s", Val::Array(0, vec![Val::U8(1), Val::U8(2)]))
        .kv("f64s", Val::Array(12, vec![Val::F64(0.5)]))
        .kv(
            "nested",
            Val::Array(
                9,
                vec![
                    Val::Array(8, vec![Val::Str("x".into()), Val::Str("yz".into())]),
                    Val::Array(4, vec![Val::U32(5)]),
                    Val::Array(9, vec![Val::Array(6, vec![Val::F32(1.0)])]),
                ],
            ),
        )
        .kv("deep", deep(8));
    let bytes = b.build();
    let g = Gguf::parse(&bytes).unwrap();

    let e = g.get_array("empty").unwrap();
    assert!(e.is_empty());
    assert_eq!(e.iter().count(), 0);
    assert_eq!(e.get(0), None);

    let bools = g.get_array("bools").unwrap();
    assert_eq!(
        bools.numbers::<bool>().unwrap().collect::<Vec<_>>(),
        [true, false]
    );
    assert_eq!(bools.get(0), Some(Value::Bool(true)));

    let i = g.get_array("i32s").unwrap();
    assert_eq!(i.numbers::<i32>().unwrap().collect::<Vec<_>>(), [-1, 2, 3]);
    assert_eq!(i.numbers::<i32>().unwrap().len(), 3);
    assert_eq!(i.raw_bytes().len(), 12);
    assert_eq!(i.iter().map(|v| v.to_i64().unwrap()).sum::<i64>(), 4);

    assert_eq!(g.get_array("u8s").unwrap().raw_bytes(), [1, 2]);
    assert_eq!(
        g.get_array("f64s").unwrap().get(0).unwrap().as_f64(),
        Some(0.5)
    );

    let nested = g.get_array("nested").unwrap();
    assert_eq!(nested.elem_type(), ValueType::Array);
    assert_eq!(nested.len(), 3);
    assert_eq!(nested.depth(), 1);
    let inner: Vec<_> = nested.arrays().unwrap().collect();
    assert_eq!(inner[0].strings().unwrap().collect::<Vec<_>>(), ["x", "yz"]);
    assert_eq!(inner[0].depth(), 2);
    assert_eq!(inner[1].get(0), Some(Value::U32(5)));
    let third = nested.get(2).unwrap().as_array().unwrap();
    let innermost = third.get(0).unwrap().as_array().unwrap();
    assert_eq!(innermost.depth(), 3);
    assert_eq!(innermost.numbers::<f32>().unwrap().next(), Some(1.0));

    // Depth 8 is the limit and is accepted.
    let mut a = g.get_array("deep").unwrap();
    for _ in 1..8 {
        a = a.get(0).unwrap().as_array().unwrap();
    }
    assert_eq!(a.depth(), 8);
    assert_eq!(a.get(0), Some(Value::U32(7)));
    touch_all(&g, &bytes);
}

fn deep(depth: usize) -> Val {
    let mut v = Val::Array(4, vec![Val::U32(7)]);
    for _ in 1..depth {
        v = Val::Array(9, vec![v]);
    }
    v
}

#[test]
fn odd_shapes() {
    let b = Builder::new()
        .tensor("scalar", &[], DType::F32)
        .tensor("empty", &[0, 4], DType::F32)
        .tensor("empty_q", &[0], DType::Q4_0)
        .tensor("four_d", &[32, 2, 3, 4], DType::Q4_1)
        .tensor("ints", &[5], DType::I32);
    let bytes = b.build();
    let g = Gguf::parse(&bytes).unwrap();
    let s = g.tensor("scalar").unwrap();
    assert_eq!(s.n_dims(), 0);
    assert_eq!(s.dims(), [] as [u64; 0]);
    assert_eq!(s.ne(), [1, 1, 1, 1]);
    assert_eq!(s.n_bytes(), 4);
    let e = g.tensor("empty").unwrap();
    assert_eq!(e.n_elements(), 0);
    assert_eq!(e.n_bytes(), 0);
    assert!(e.data(&bytes).is_empty());
    let f = g.tensor("four_d").unwrap();
    assert_eq!(f.n_bytes(), 20 * 24);
    assert_eq!(f.ne(), [32, 2, 3, 4]);
    g.check_packed_layout().unwrap();
    touch_all(&g, &bytes);
}

#[test]
fn overlaps_and_gaps_are_allowed_but_not_packed() {
    // Two tensors sharing their data.
    let mut b = Builder::new()
        .tensor("a", &[8], DType::F32)
        .tensor("b", &[8], DType::F32);
    b.tensors[1].offset = Some(0);
    let bytes = b.build();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(
        g.tensor("a").unwrap().byte_range(),
        g.tensor("b").unwrap().byte_range()
    );
    let e = g.check_packed_layout().unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::UnexpectedOffset {
            found: 0,
            expected: 32
        }
    );
    assert_eq!(e.field().to_string(), "tensor_info[1].offset");
    assert_eq!(e.name(), Some("b"));

    // A gap before the first tensor.
    let mut b = Builder::new().tensor("a", &[8], DType::F32);
    b.tensors[0].offset = Some(64);
    let bytes = b.build();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.tensor("a").unwrap().offset(), 64);
    assert!(g.check_packed_layout().is_err());
    touch_all(&g, &bytes);
}

#[test]
fn unpadded_end_is_accepted() {
    let mut b = Builder::new().tensor("a", &[3], DType::F32);
    b.pad_end = false;
    let bytes = b.build();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.tensor("a").unwrap().byte_range().end, bytes.len());
}

#[test]
fn parse_prefix_reads_only_the_header() {
    let bytes = sample().build();
    let header = sample().header().len();
    let g = Gguf::parse_prefix(&bytes[..header], bytes.len() as u64).unwrap();
    assert_eq!(g.tensor_count(), 3);
    assert_eq!(g.get_str("general.architecture"), Some("llama"));
    for t in g.tensors() {
        assert_eq!(g.tensor_data(&t), None);
        assert_eq!(t.data(&bytes).len(), t.n_bytes());
    }
    // Same infos as a full parse.
    let full = Gguf::parse(&bytes).unwrap();
    assert!(g.tensors().eq(full.tensors()));

    // A prefix that does not hold the header.
    let e = Gguf::parse_prefix(&bytes[..header - 1], bytes.len() as u64).unwrap_err();
    assert_eq!(e.kind().name(), "Truncated");
    // A file length that does not hold the data.
    let e = Gguf::parse_prefix(&bytes[..header], bytes.len() as u64 - 1).unwrap_err();
    assert_eq!(e.kind().name(), "OffsetOutOfBounds");
    // Bytes past the file length are ignored.
    let mut longer = bytes.clone();
    longer.extend([0xff; 100]);
    let g = Gguf::parse_prefix(&longer, bytes.len() as u64).unwrap();
    assert_eq!(g.bytes().len(), bytes.len());
}

#[test]
fn data_with_a_short_file_is_empty() {
    let bytes = sample().build();
    let g = Gguf::parse(&bytes).unwrap();
    let t = g.tensor_at(2).unwrap();
    assert!(t.data(&bytes[..10]).is_empty());
}

#[test]
fn many_tensors_and_keys_are_unique_checked() {
    // Enough names to make the Bloom filter report false positives.
    let mut b = Builder::new();
    for i in 0..3000 {
        b = b.kv(&format!("key.{i}"), Val::U32(i));
        b.tensors
            .push(TensorSpec::new(&format!("t.{i}"), &[1], DType::F32));
    }
    let bytes = b.build();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.tensor_count(), 3000);
    assert_eq!(g.get_u32("key.2999"), Some(2999));
    assert_eq!(g.tensor("t.1234").unwrap().offset(), 1234 * 32);

    let mut dup = b.clone();
    dup.tensors[2999].name = b"t.1500".to_vec();
    let e = Gguf::parse(&dup.build()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DuplicateName { first_index: 1500 });
    assert_eq!(e.field().to_string(), "tensor_info[2999].name");
}

#[test]
fn error_display() {
    let mut b = sample();
    b.tensors[1].type_id = 77;
    let e = Gguf::parse(&b.build()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("invalid GGUF: tensor_info[1].type (\"output_norm.weight\") at byte "));
    assert!(msg.ends_with("unknown ggml type id 77"), "{msg}");
    let as_error: &dyn core::error::Error = &e;
    assert_eq!(as_error.to_string(), msg);
}

/// Writes small valid files as fuzzing seeds into `$GGML_RS_WRITE_FUZZ_SEEDS` (a
/// directory) when that variable is set; does nothing otherwise. The committed seeds in
/// `ggml-core/fuzz/seeds/gguf_parse` come from here.
#[test]
fn write_fuzz_seeds() {
    let Some(dir) = std::env::var_os("GGML_RS_WRITE_FUZZ_SEEDS") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut v2 = sample();
    v2.version = 2;
    let mut align8 = sample().kv("general.alignment", Val::U32(8));
    align8.alignment = 8;
    let scalars = Builder::new()
        .kv("u8", Val::U8(1))
        .kv("i8", Val::I8(-1))
        .kv("u16", Val::U16(2))
        .kv("i16", Val::I16(-2))
        .kv("u32", Val::U32(3))
        .kv("i32", Val::I32(-3))
        .kv("u64", Val::U64(4))
        .kv("i64", Val::I64(-4))
        .kv("f32", Val::F32(0.5))
        .kv("f64", Val::F64(0.25))
        .kv("bool", Val::Bool(true))
        .kv("s", Val::Str("x".into()));
    let nested = Builder::new()
        .kv(
            "n",
            Val::Array(
                9,
                vec![
                    Val::Array(8, vec![Val::Str("a".into()), Val::Str("bc".into())]),
                    Val::Array(7, vec![Val::Bool(false)]),
                    deep(3),
                ],
            ),
        )
        .tensor("x", &[4, 2], DType::F16);
    let shapes = Builder::new()
        .tensor("scalar", &[], DType::F32)
        .tensor("empty", &[0, 4], DType::BF16)
        .tensor("q", &[32, 1, 1, 2], DType::Q5_1)
        .tensor("k", &[256], DType::Q6K);
    let seeds = [
        ("sample_v3.gguf", sample().build()),
        ("sample_v2.gguf", v2.build()),
        ("align8.gguf", align8.build()),
        ("minimal.gguf", Builder::new().header()),
        ("scalars.gguf", scalars.build()),
        ("nested.gguf", nested.build()),
        ("shapes.gguf", shapes.build()),
    ];
    for (name, bytes) in seeds {
        Gguf::parse(&bytes).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
