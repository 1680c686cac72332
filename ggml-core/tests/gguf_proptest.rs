//! Property tests: parsing never panics, on arbitrary bytes and on mutated valid files,
//! and whatever parses keeps every promise of the accessors.

mod common;

use common::{sample, touch_all, Builder, Val};
use ggml_core::gguf::Gguf;
use ggml_core::DType;
use proptest::prelude::*;

fn check(bytes: &[u8]) {
    match Gguf::parse(bytes) {
        Ok(g) => {
            touch_all(&g, bytes);
        }
        Err(e) => {
            assert!(e.offset() <= bytes.len() as u64, "{e}");
            let _ = e.to_string();
        }
    }
    // A prefix parse against a longer claimed length must not panic either.
    let half = &bytes[..bytes.len() / 2];
    if let Ok(g) = Gguf::parse_prefix(half, bytes.len() as u64) {
        touch_all(&g, bytes);
    }
}

fn valid_files() -> Vec<Vec<u8>> {
    let mut with_align = sample().kv("general.alignment", Val::U32(8));
    with_align.alignment = 8;
    vec![
        sample().build(),
        with_align.build(),
        Builder::new().build(),
        Builder::new()
            .kv(
                "nested",
                Val::Array(
                    9,
                    vec![
                        Val::Array(8, vec![Val::Str("a".into())]),
                        Val::Array(7, vec![Val::Bool(true)]),
                    ],
                ),
            )
            .tensor("x", &[4, 2], DType::F16)
            .build(),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    /// Writes a little-endian u64 (a count or length) at a position.
    SetU64(usize, u64),
    Truncate(usize),
    Insert(usize, u8),
    Remove(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting = prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(1 << 60),
        Just(1 << 32),
        Just(i64::MAX as u64),
        any::<u64>(),
        0u64..64,
    ];
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        2 => (any::<usize>(), interesting).prop_map(|(i, v)| Mutation::SetU64(i, v)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => any::<usize>().prop_map(Mutation::Remove),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    let n = bytes.len();
    match *m {
        Mutation::Set(i, b) => bytes[i % n] = b,
        Mutation::SetU64(i, v) => {
            for (k, b) in v.to_le_bytes().into_iter().enumerate() {
                if let Some(slot) = bytes.get_mut(i % n + k) {
                    *slot = b;
                }
            }
        }
        Mutation::Truncate(i) => bytes.truncate(i % n),
        Mutation::Insert(i, b) => bytes.insert(i % n, b),
        Mutation::Remove(i) => {
            bytes.remove(i % n);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check(&bytes);
    }

    #[test]
    fn arbitrary_bodies_never_panic(
        version in prop_oneof![Just(2u32), Just(3u32)],
        n_tensors in prop_oneof![0u64..4, any::<u64>()],
        n_kv in prop_oneof![0u64..4, any::<u64>()],
        body in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(version.to_le_bytes());
        bytes.extend(n_tensors.to_le_bytes());
        bytes.extend(n_kv.to_le_bytes());
        bytes.extend(body);
        check(&bytes);
    }

    #[test]
    fn mutated_valid_files_never_panic(
        file in 0usize..4,
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let mut bytes = valid_files().swap_remove(file);
        for m in &mutations {
            apply(&mut bytes, m);
        }
        check(&bytes);
    }
}
