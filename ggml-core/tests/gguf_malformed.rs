//! Malformed GGUF files: each must fail with the precise error kind and field.

mod common;

use common::{sample, Builder, Val};
use ggml_core::gguf::{ErrorKind, Gguf, GgufError};
use ggml_core::DType;
use rstest::rstest;

fn with(f: impl FnOnce(&mut Builder)) -> Vec<u8> {
    let mut b = sample();
    f(&mut b);
    b.build()
}

/// A header with the given counts followed by `body`.
fn raw(n_tensors: u64, n_kv: u64, body: &[u8]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(n_tensors.to_le_bytes());
    out.extend(n_kv.to_le_bytes());
    out.extend(body);
    out
}

fn string(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    common::write_str(&mut out, s);
    out
}

/// Arrays nested `depth` deep around a single u32.
fn nest(depth: usize) -> Val {
    let mut v = Val::Array(4, vec![Val::U32(7)]);
    for _ in 1..depth {
        v = Val::Array(9, vec![v]);
    }
    v
}

fn truncated(mut bytes: Vec<u8>, len: usize) -> Vec<u8> {
    bytes.truncate(len);
    bytes
}

fn sample_header_len() -> usize {
    sample().header().len()
}

#[rstest]
#[case::empty(vec![], "Truncated", "magic", None)]
#[case::short_magic(b"GGU".to_vec(), "Truncated", "magic", None)]
#[case::bad_magic(with(|b| b.magic = *b"GGML"), "BadMagic", "magic", None)]
#[case::version_1(with(|b| b.version = 1), "UnsupportedVersion", "version", None)]
#[case::version_4(with(|b| b.version = 4), "UnsupportedVersion", "version", None)]
#[case::big_endian(with(|b| b.version = 3u32.swap_bytes()), "BigEndian", "version", None)]
#[case::cut_in_tensor_count(truncated(sample().build(), 12), "Truncated", "tensor_count", None)]
#[case::cut_in_kv_count(truncated(sample().build(), 20), "Truncated", "metadata_kv_count", None)]
#[case::kv_count_2_pow_60(with(|b| b.n_kv = Some(1 << 60)), "CountTooLarge", "metadata_kv_count", None)]
#[case::tensor_count_2_pow_60(with(|b| b.n_tensors = Some(1 << 60)), "CountTooLarge", "tensor_count", None)]
#[case::tensor_count_max(with(|b| b.n_tensors = Some(u64::MAX)), "CountTooLarge", "tensor_count", None)]
#[case::tensor_count_vs_rest(
    raw(20, 1, &[string(b"k"), 8u32.to_le_bytes().to_vec(), string(&[b'x'; 1000])].concat()),
    "CountTooLarge", "tensor_count", None
)]
#[case::key_length_huge(
    raw(0, 1, &[(1u64 << 62).to_le_bytes().to_vec(), vec![0; 16]].concat()),
    "StringTooLong", "metadata[0].key", None
)]
#[case::key_invalid_utf8(with(|b| b.kvs[1].0 = vec![b'a', 0xff, 0xfe]), "InvalidUtf8", "metadata[1].key", None)]
#[case::value_type_13(
    with(|b| b.kvs[2].1 = Val::Raw { type_id: 13, bytes: vec![0; 4] }),
    "BadValueType", "metadata[2].type", Some("llama.context_length")
)]
#[case::value_type_max(
    with(|b| b.kvs[2].1 = Val::Raw { type_id: u32::MAX, bytes: vec![0; 4] }),
    "BadValueType", "metadata[2].type", Some("llama.context_length")
)]
#[case::value_cut(
    raw(0, 1, &[string(b"a"), 4u32.to_le_bytes().to_vec(), vec![1, 2]].concat()),
    "Truncated", "metadata[0].value", Some("a")
)]
#[case::string_value_invalid_utf8(
    with(|b| b.kvs[0].1 = Val::RawStr(b"ll\xc3ama".to_vec())),
    "InvalidUtf8", "metadata[0].value", Some("general.architecture")
)]
#[case::string_value_too_long(
    with(|b| b.kvs[0].1 = Val::Raw { type_id: 8, bytes: (1u64 << 40).to_le_bytes().to_vec() }),
    "StringTooLong", "metadata[0].value", Some("general.architecture")
)]
#[case::bool_2(
    with(|b| b.kvs[6].1 = Val::Raw { type_id: 7, bytes: vec![2] }),
    "BadBool", "metadata[6].value", Some("general.flag")
)]
#[case::bool_array_element(
    with(|b| b.kvs[6].1 = Val::ArrayRaw { elem: 7, count: 3, bytes: vec![0, 3, 1] }),
    "BadBool", "metadata[6].value[1]", Some("general.flag")
)]
#[case::array_elem_type_42(
    with(|b| b.kvs[4].1 = Val::ArrayRaw { elem: 42, count: 0, bytes: vec![] }),
    "BadValueType", "metadata[4].value", Some("tokenizer.ggml.tokens")
)]
#[case::array_count_2_pow_61(
    with(|b| b.kvs[5].1 = Val::ArrayRaw { elem: 6, count: 1 << 61, bytes: vec![] }),
    "CountTooLarge", "metadata[5].value", Some("tokenizer.ggml.scores")
)]
#[case::string_array_count_huge(
    with(|b| b.kvs[4].1 = Val::ArrayRaw { elem: 8, count: u64::MAX, bytes: vec![] }),
    "CountTooLarge", "metadata[4].value", Some("tokenizer.ggml.tokens")
)]
#[case::string_array_element_invalid_utf8(
    with(|b| b.kvs[4].1 = Val::Array(8, vec![
        Val::Str("a".into()), Val::Str("b".into()), Val::RawStr(vec![0xc0, 0x80]),
    ])),
    "InvalidUtf8", "metadata[4].value[2]", Some("tokenizer.ggml.tokens")
)]
#[case::nested_too_deep(
    with(|b| b.kvs[4].1 = nest(9)),
    "NestedTooDeep", "metadata[4].value[0][0][0][0][0][0][0][0]", Some("tokenizer.ggml.tokens")
)]
#[case::nested_bad_element(
    with(|b| b.kvs[4].1 = Val::Array(9, vec![
        Val::Array(4, vec![Val::U32(1), Val::U32(2), Val::U32(3)]),
        Val::Array(8, vec![Val::Str("a".into()), Val::Str("b".into()), Val::RawStr(vec![0xff])]),
    ])),
    "InvalidUtf8", "metadata[4].value[1][2]", Some("tokenizer.ggml.tokens")
)]
#[case::nested_bad_elem_type(
    with(|b| b.kvs[4].1 = Val::Array(9, vec![
        Val::Array(4, vec![]),
        Val::ArrayRaw { elem: 99, count: 0, bytes: vec![] },
    ])),
    "BadValueType", "metadata[4].value[1]", Some("tokenizer.ggml.tokens")
)]
#[case::duplicate_key(
    with(|b| b.kvs.push((b"llama.block_count".to_vec(), Val::U32(3)))),
    "DuplicateKey", "metadata[7].key", Some("llama.block_count")
)]
#[case::alignment_3(
    with(|b| b.kvs.push((b"general.alignment".to_vec(), Val::U32(3)))),
    "BadAlignment", "metadata[7].value", Some("general.alignment")
)]
#[case::alignment_0(
    with(|b| b.kvs.push((b"general.alignment".to_vec(), Val::U32(0)))),
    "BadAlignment", "metadata[7].value", Some("general.alignment")
)]
#[case::alignment_u64(
    with(|b| b.kvs.push((b"general.alignment".to_vec(), Val::U64(32)))),
    "WrongType", "metadata[7].value", Some("general.alignment")
)]
#[case::tensor_name_64_bytes(
    with(|b| b.tensors[0].name = vec![b'n'; 64]),
    "StringTooLong", "tensor_info[0].name", None
)]
#[case::tensor_name_invalid_utf8(
    with(|b| b.tensors[1].name = b"bad\xffname".to_vec()),
    "InvalidUtf8", "tensor_info[1].name", None
)]
#[case::five_dims(
    with(|b| b.tensors[1].n_dims = Some(5)),
    "TooManyDims", "tensor_info[1].n_dims", Some("output_norm.weight")
)]
#[case::dim_above_i64_max(
    with(|b| b.tensors[1].dims = vec![1 << 63]),
    "DimOverflow", "tensor_info[1].dims[0]", Some("output_norm.weight")
)]
#[case::element_count_overflow(
    with(|b| b.tensors[1].dims = vec![1 << 40, 1 << 20, 1 << 10]),
    "DimOverflow", "tensor_info[1].dims[2]", Some("output_norm.weight")
)]
#[case::byte_size_overflow(
    with(|b| b.tensors[1].dims = vec![1 << 62]),
    "SizeOverflow", "tensor_info[1].dims", Some("output_norm.weight")
)]
#[case::ne0_not_block_multiple(
    with(|b| b.tensors[0].dims = vec![48, 3]),
    "BadBlockAlignment", "tensor_info[0].dims[0]", Some("token_embd.weight")
)]
#[case::scalar_quantized(
    with(|b| b.tensors[2].dims = vec![]),
    "BadBlockAlignment", "tensor_info[2].type", Some("blk.0.attn_q.weight")
)]
#[case::unknown_dtype(
    with(|b| b.tensors[1].type_id = 77),
    "UnknownDType", "tensor_info[1].type", Some("output_norm.weight")
)]
#[case::unsupported_dtype(
    with(|b| b.tensors[1].type_id = 16),
    "UnsupportedDType", "tensor_info[1].type", Some("output_norm.weight")
)]
#[case::removed_dtype(
    with(|b| b.tensors[1].type_id = 4),
    "UnsupportedDType", "tensor_info[1].type", Some("output_norm.weight")
)]
#[case::misaligned_offset(
    with(|b| b.tensors[1].offset = Some(36)),
    "MisalignedOffset", "tensor_info[1].offset", Some("output_norm.weight")
)]
#[case::offset_out_of_bounds(
    with(|b| b.tensors[2].offset = Some(1 << 30)),
    "OffsetOutOfBounds", "tensor_info[2].offset", Some("blk.0.attn_q.weight")
)]
#[case::offset_overflows(
    with(|b| b.tensors[2].offset = Some(u64::MAX - 31)),
    "OffsetOutOfBounds", "tensor_info[2].offset", Some("blk.0.attn_q.weight")
)]
#[case::data_cut(
    truncated(sample().build(), sample().build().len() - 100),
    "OffsetOutOfBounds", "tensor_info[2].offset", Some("blk.0.attn_q.weight")
)]
#[case::empty_tensor_past_end(
    // No padding after the header: the data section starts past the end of the file.
    Builder::new().tensor("e", &[0], DType::F32).header(),
    "OffsetOutOfBounds", "tensor_info[0].offset", Some("e")
)]
#[case::duplicate_tensor_name(
    with(|b| b.tensors[2].name = b"token_embd.weight".to_vec()),
    "DuplicateName", "tensor_info[2].name", Some("token_embd.weight")
)]
#[case::cut_in_tensor_info(
    truncated(sample().build(), sample_header_len() - 4),
    "Truncated", "tensor_info[2].offset", Some("blk.0.attn_q.weight")
)]
#[case::cut_in_dims(
    truncated(sample().build(), sample_header_len() - 8 - 4 - 4),
    "Truncated", "tensor_info[2].dims[1]", Some("blk.0.attn_q.weight")
)]
fn malformed(
    #[case] bytes: Vec<u8>,
    #[case] kind: &str,
    #[case] field: &str,
    #[case] name: Option<&str>,
) {
    let err = Gguf::parse(&bytes).expect_err("malformed file accepted");
    assert_eq!(err.kind().name(), kind, "{err}");
    assert_eq!(err.field().to_string(), field, "{err}");
    assert_eq!(err.name(), name, "{err}");
    assert!(err.offset() <= bytes.len() as u64, "{err}");
    // The message names the field and the reason.
    let msg = err.to_string();
    assert!(msg.contains(field), "{msg}");
}

fn parse_err(bytes: &[u8]) -> GgufError {
    Gguf::parse(bytes).expect_err("malformed file accepted")
}

#[test]
fn error_details() {
    let e = parse_err(&with(|b| b.n_kv = Some(1 << 60)));
    assert_eq!(e.offset(), 16);
    assert!(matches!(e.kind(), ErrorKind::CountTooLarge { count, .. } if count == 1 << 60));

    let e = parse_err(&with(|b| b.tensors[1].type_id = 77));
    assert_eq!(e.kind(), ErrorKind::UnknownDType { id: 77 });
    let msg = e.to_string();
    assert!(
        msg.contains("output_norm.weight") && msg.contains("77"),
        "{msg}"
    );

    let e = parse_err(&with(|b| b.tensors[1].type_id = 16));
    assert!(e.to_string().contains("iq2_xxs"), "{e}");

    let e = parse_err(&with(|b| {
        b.kvs.push((b"llama.block_count".to_vec(), Val::U32(3)))
    }));
    assert_eq!(e.kind(), ErrorKind::DuplicateKey { first_index: 1 });

    let e = parse_err(&with(|b| b.tensors[2].name = b"token_embd.weight".to_vec()));
    assert_eq!(e.kind(), ErrorKind::DuplicateName { first_index: 0 });

    let e = parse_err(&with(|b| b.tensors[0].dims = vec![48, 3]));
    assert_eq!(
        e.kind(),
        ErrorKind::BadBlockAlignment {
            ne0: 48,
            block_size: 32
        }
    );

    let e = parse_err(&with(|b| b.tensors[1].offset = Some(36)));
    assert_eq!(
        e.kind(),
        ErrorKind::MisalignedOffset {
            offset: 36,
            alignment: 32
        }
    );

    let e = parse_err(&with(|b| b.version = 1));
    assert_eq!(e.kind(), ErrorKind::UnsupportedVersion { version: 1 });
    assert_eq!(e.offset(), 4);

    let e = parse_err(&with(|b| b.tensors[0].name = vec![b'n'; 64]));
    assert_eq!(e.kind(), ErrorKind::StringTooLong { len: 64, max: 63 });

    // The offset of an invalid UTF-8 byte points at that byte.
    let bytes = with(|b| b.kvs[0].1 = Val::RawStr(b"ll\xc3ama".to_vec()));
    let e = parse_err(&bytes);
    assert_eq!(e.kind(), ErrorKind::InvalidUtf8 { valid_up_to: 2 });
    assert_eq!(bytes[e.offset() as usize], 0xc3);
}

#[test]
fn long_names_are_cut_in_errors() {
    let key = "x".repeat(30) + "é" + &"y".repeat(30);
    let bytes = Builder::new()
        .kv(
            &key,
            Val::Raw {
                type_id: 99,
                bytes: vec![0; 4],
            },
        )
        .build();
    let e = parse_err(&bytes);
    let name = e.error_name().unwrap();
    assert!(name.is_truncated());
    assert!(key.starts_with(name.as_str()));
    assert!(name.as_str().len() <= ggml_core::gguf::ERROR_NAME_CAPACITY);
    assert!(e.to_string().contains("..."), "{e}");
}

#[test]
fn error_is_small() {
    // Keeps `Result<_, GgufError>` cheap to return (and clippy's result_large_err quiet).
    assert!(core::mem::size_of::<GgufError>() < 128);
}

#[test]
fn truncation_anywhere_fails_cleanly() {
    let bytes = sample().build();
    let header = sample_header_len();
    for len in 0..bytes.len() {
        let r = Gguf::parse(&bytes[..len]);
        if len < header {
            assert!(r.is_err(), "prefix of {len} bytes accepted");
        }
        if let Err(e) = r {
            assert!(e.offset() <= len as u64, "{e}");
        }
    }
    // Only the file with all its tensor data parses.
    let last = sample().tensors.len() - 1;
    let g = Gguf::parse(&bytes).unwrap();
    let end = g.tensor_at(last).unwrap().byte_range().end;
    assert!(Gguf::parse(&bytes[..end]).is_ok());
    assert!(Gguf::parse(&bytes[..end - 1]).is_err());
}
