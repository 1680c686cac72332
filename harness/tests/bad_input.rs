//! Input a user gives the harness, at its worst: matrix files, `--devices` strings,
//! corpus files and text for the tokenizer, and GGUF files the harness writes. Each is
//! either accepted or refused with a one-line error that names what is wrong; nothing
//! panics.

use std::path::PathBuf;

use ggml_core::gguf::Gguf;
use ggml_core::DType;
use harness::devices::DeviceList;
use harness::gguf_writer::{GgufWriter, MetaValue};
use harness::matrix::file::parse;
use harness::synthetic::{synthetic_gguf, SyntheticSpec};
use harness::tokenizer::Tokenizer;
use proptest::prelude::*;

fn one_line(e: &str) -> bool {
    !e.is_empty() && !e.contains('\n')
}

/// Matrix text: the shipped cuda-sim matrix with a random splice of TOML-ish bytes.
fn mutated_matrix() -> impl Strategy<Value = String> {
    let base = harness::matrix::CUDA_SIM_MATRIX;
    (
        0..base.len(),
        0usize..40,
        "[\\[\\]{}=\",.#a-z0-9_:* \n-]{0,40}",
    )
        .prop_map(move |(at, cut, insert)| {
            let at = (0..=at)
                .rev()
                .find(|&i| base.is_char_boundary(i))
                .unwrap_or(0);
            let end = (at..=base.len().min(at + cut))
                .rev()
                .find(|&i| base.is_char_boundary(i))
                .unwrap_or(at);
            format!("{}{insert}{}", &base[..at], &base[end..])
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Any text: a matrix or an error `m.toml:LINE: reason` on one line, LINE in the file
    /// (or the line after its last newline, for an error at the end of the text).
    #[test]
    fn matrix_files_parse_or_name_their_line(text in prop_oneof![
        mutated_matrix(),
        "\\PC{0,200}",
    ]) {
        if let Err(e) = parse("m.toml", None, &text) {
            let e = e.to_string();
            prop_assert!(one_line(&e), "{e:?}");
            let line: usize = e
                .strip_prefix("m.toml:")
                .and_then(|r| r.split(':').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no line in {e:?}"));
            prop_assert!(line >= 1 && line <= text.lines().count() + 1, "{e:?}");
        }
    }

    /// Device lists: any string over their alphabet parses or gives a one-line error.
    #[test]
    fn device_lists_parse_or_say_why(s in "[cpuda-sim:x0-9,ACPU ]{0,30}") {
        match s.parse::<DeviceList>() {
            Ok(list) => {
                // What parses prints back to something that parses to the same list.
                let again: DeviceList = list.to_string().parse().unwrap();
                prop_assert_eq!(again.to_string(), list.to_string());
            }
            Err(e) => prop_assert!(one_line(&e.to_string()), "{e}"),
        }
    }

    /// The synthetic model's byte-level tokenizer on any text, NULs and control
    /// characters included: it encodes, and decoding gives the text back.
    #[test]
    fn tokenizer_round_trips_any_text(text in "\\PC{0,64}|[\\x00-\\x1f \\t\\n]{0,64}") {
        let tok = tokenizer();
        let ids = tok.encode_with(&text, false);
        prop_assert_eq!(tok.decode(&ids), text);
    }

    /// Whatever metadata and tensors the writer gets, the parser reads the same back.
    #[test]
    fn gguf_writer_and_reader_round_trip(
        kvs in prop::collection::vec(("[a-z.]{1,12}", meta_value()), 0..8),
        tensors in prop::collection::vec(("[a-z_.]{1,10}", 1u64..40, 1u64..4), 0..5),
    ) {
        let mut kvs = kvs;
        kvs.sort_by(|a, b| a.0.cmp(&b.0));
        kvs.dedup_by(|a, b| a.0 == b.0);
        let mut tensors = tensors;
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        tensors.dedup_by(|a, b| a.0 == b.0);
        let mut w = GgufWriter::new();
        for (k, v) in &kvs {
            w.meta(k, v.clone());
        }
        for (i, (name, n0, n1)) in tensors.iter().enumerate() {
            let data: Vec<u8> = (0..n0 * n1 * 4).map(|b| (b as usize * 7 + i) as u8).collect();
            w.tensor(name, DType::F32, &[*n0, *n1], data);
        }
        let bytes = w.to_bytes().map_err(TestCaseError::fail)?;
        let g = Gguf::parse(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(g.metadata_count(), kvs.len());
        for (k, v) in &kvs {
            match v {
                MetaValue::U32(x) => prop_assert_eq!(g.get_u32(k), Some(*x)),
                MetaValue::I32(x) => prop_assert_eq!(g.get_i32(k), Some(*x)),
                MetaValue::F32(x) => prop_assert_eq!(g.get_f32(k).map(f32::to_bits), Some(x.to_bits())),
                MetaValue::Bool(x) => prop_assert_eq!(g.get_bool(k), Some(*x)),
                MetaValue::Str(x) => prop_assert_eq!(g.get_str(k), Some(x.as_str())),
                MetaValue::StrArray(x) => {
                    let got: Vec<&str> = g.get_array(k).and_then(|a| a.strings()).unwrap().collect();
                    prop_assert_eq!(got, x.iter().map(String::as_str).collect::<Vec<_>>());
                }
                MetaValue::I32Array(x) => {
                    let a = g.get_array(k).unwrap();
                    let got: Vec<i32> = a.numbers::<i32>().unwrap().collect();
                    prop_assert_eq!(&got, x);
                }
                MetaValue::F32Array(x) => {
                    let a = g.get_array(k).unwrap();
                    let got: Vec<u32> = a.numbers::<f32>().unwrap().map(f32::to_bits).collect();
                    prop_assert_eq!(got, x.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                }
            }
        }
        prop_assert_eq!(g.tensor_count(), tensors.len());
        for (i, (name, n0, n1)) in tensors.iter().enumerate() {
            let t = g.tensor(name).unwrap();
            prop_assert_eq!(t.dims(), &[*n0, *n1][..]);
            let data: Vec<u8> = (0..n0 * n1 * 4).map(|b| (b as usize * 7 + i) as u8).collect();
            prop_assert_eq!(g.tensor_data(&t).unwrap(), &data[..]);
        }
        // A cut file is refused, or (cut inside the data) its tensors read back whole or
        // not at all: never misread.
        for cut in [1, bytes.len() / 3, bytes.len() - 1] {
            if let Ok(g) = Gguf::parse(&bytes[..cut]) {
                for (i, (name, n0, n1)) in tensors.iter().enumerate() {
                    let t = g.tensor(name).unwrap();
                    let want: Vec<u8> =
                        (0..n0 * n1 * 4).map(|b| (b as usize * 7 + i) as u8).collect();
                    if let Some(got) = g.tensor_data(&t) {
                        prop_assert_eq!(got, &want[..]);
                    }
                }
            }
        }
    }
}

fn meta_value() -> impl Strategy<Value = MetaValue> {
    prop_oneof![
        any::<u32>().prop_map(MetaValue::U32),
        any::<i32>().prop_map(MetaValue::I32),
        any::<f32>().prop_map(MetaValue::F32),
        any::<bool>().prop_map(MetaValue::Bool),
        "\\PC{0,20}".prop_map(MetaValue::Str),
        prop::collection::vec("\\PC{0,8}", 0..5).prop_map(MetaValue::StrArray),
        prop::collection::vec(any::<i32>(), 0..6).prop_map(MetaValue::I32Array),
        prop::collection::vec(any::<f32>(), 0..6).prop_map(MetaValue::F32Array),
    ]
}

fn tokenizer() -> &'static Tokenizer {
    static TOK: std::sync::OnceLock<(Vec<u8>, Tokenizer)> = std::sync::OnceLock::new();
    &TOK.get_or_init(|| {
        let bytes = synthetic_gguf(&SyntheticSpec::tiny(DType::Q4_0));
        let tok = Tokenizer::from_gguf(&Gguf::parse(&bytes).unwrap()).unwrap();
        (bytes, tok)
    })
    .1
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ggml-rs-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Corpus files: invalid UTF-8 is a one-line error naming the file; NULs, an empty file
/// and a 1 MiB line are text like any other.
#[test]
fn corpus_files_at_their_worst() {
    let bad = scratch("bad-utf8.txt");
    std::fs::write(&bad, b"GNU \xff\xfe General").unwrap();
    let e = harness::corpus_text(Some(&bad)).unwrap_err().to_string();
    assert!(one_line(&e) && e.contains("bad-utf8.txt"), "{e}");

    let empty = scratch("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(harness::corpus_text(Some(&empty)).unwrap(), "");

    let odd = scratch("odd.txt");
    let long = format!("a\0b\r\n{}\n", "x".repeat(1 << 20));
    std::fs::write(&odd, &long).unwrap();
    let text = harness::corpus_text(Some(&odd)).unwrap();
    assert_eq!(text, long.trim_end_matches('\n'));
    let ids = tokenizer().encode_with(&text, false);
    assert_eq!(tokenizer().decode(&ids), text);

    let missing = scratch("no-such-file.txt");
    let e = harness::corpus_text(Some(&missing))
        .unwrap_err()
        .to_string();
    assert!(one_line(&e) && e.contains("no-such-file.txt"), "{e}");
}

/// The fuzzer's finding: the writer wrote `general.alignment` as given (a bool here) and
/// always aligned to 32, so readers refused the file, or with a u32 other than 32 read
/// the tensors from the wrong offsets. Now the declared alignment is used, and one
/// readers would refuse is an error.
#[test]
fn gguf_writer_honours_or_refuses_general_alignment() {
    let data: Vec<u8> = (0..12).collect();
    for align in [1u32, 8, 64, 256] {
        let mut w = GgufWriter::new();
        w.meta("general.alignment", MetaValue::U32(align));
        w.tensor("a", DType::F32, &[3], data.clone());
        w.tensor("b", DType::F32, &[3], data.iter().rev().copied().collect());
        let bytes = w.to_bytes().unwrap();
        let g = Gguf::parse(&bytes).unwrap();
        assert_eq!(g.alignment(), align);
        assert_eq!(g.tensor_data(&g.tensor("a").unwrap()).unwrap(), &data[..]);
        let b: Vec<u8> = data.iter().rev().copied().collect();
        assert_eq!(g.tensor_data(&g.tensor("b").unwrap()).unwrap(), &b[..]);
    }
    for bad in [MetaValue::Bool(true), MetaValue::U32(0), MetaValue::U32(48)] {
        let mut w = GgufWriter::new();
        w.meta("general.alignment", bad);
        let e = w.to_bytes().unwrap_err();
        assert!(one_line(&e) && e.contains("general.alignment"), "{e}");
    }
    let mut w = GgufWriter::new();
    w.meta("k", MetaValue::U32(1)).meta("k", MetaValue::U32(2));
    assert!(w.to_bytes().unwrap_err().contains("given twice"));
}

/// The fuzzer's second finding: tensor names past ggml's 63 bytes were written, and
/// readers refused the file.
#[test]
fn gguf_writer_refuses_what_readers_refuse() {
    let mut w = GgufWriter::new();
    w.tensor(&"n".repeat(63), DType::F32, &[1], vec![0; 4]);
    assert!(Gguf::parse(&w.to_bytes().unwrap()).is_ok());
    w.tensor(&"n".repeat(64), DType::F32, &[1], vec![0; 4]);
    let e = w.to_bytes().unwrap_err();
    assert!(one_line(&e) && e.contains("limit of 63"), "{e}");
    let mut w = GgufWriter::new();
    w.tensor("t", DType::F32, &[1], vec![0; 4]);
    w.tensor("t", DType::F32, &[1], vec![0; 4]);
    assert!(w.to_bytes().unwrap_err().contains("given twice"));
    let mut w = GgufWriter::new();
    w.tensor("t", DType::F32, &[1, 1, 1, 1, 1], vec![0; 4]);
    assert!(w.to_bytes().unwrap_err().contains("dimensions"));
}

/// The fuzzer's finding: a `--devices` error quoted the input raw, so a newline in it
/// broke the one-line error.
#[test]
fn device_errors_stay_on_one_line() {
    let e = ":\n\n\nu05bpa"
        .parse::<DeviceList>()
        .unwrap_err()
        .to_string();
    assert!(one_line(&e), "{e}");
    assert!(e.contains("\":\\n\\n\\nu05bpa\""), "{e}");
}

/// The KL base fuzz target's committed seeds: the valid one opens, checks against its own
/// tokens and reads both chunks; the truncated one is a one-line error naming the file.
#[test]
fn kl_base_fuzz_seeds() {
    use harness::kl::{ChunkLogProbs, KlBase};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/kl_base");
    let valid = std::fs::read(dir.join("valid-16x10x2")).unwrap();
    let mut base = KlBase::from_source("v", Box::new(std::io::Cursor::new(valid.clone()))).unwrap();
    let tokens: Vec<u32> = valid[20..20 + 4 * 32]
        .chunks(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(base.check_run(16, 10, &tokens).unwrap(), 2);
    let mut out = ChunkLogProbs::default();
    for c in 0..2 {
        base.read_chunk(c, &mut out).unwrap();
    }
    let cut = std::fs::read(dir.join("truncated")).unwrap();
    let e = match KlBase::from_source("t.kld", Box::new(std::io::Cursor::new(cut))) {
        Ok(_) => panic!("a truncated file is refused"),
        Err(e) => e.to_string(),
    };
    assert!(one_line(&e) && e.starts_with("t.kld: "), "{e}");
}
