//! The bodies of ggml-core's fuzz targets, as functions: the cargo-fuzz targets call
//! them, and ggml-core's `tests/fuzz_seeds.rs` replays the committed seeds through them
//! (including this file by path), so every seed runs in CI without libFuzzer.

#[path = "../../tests/common/getters.rs"]
mod getters;

use ggml_core::gguf::{ArrayValue, Gguf, Value};

/// Parses arbitrary bytes as GGUF and touches every accessor of whatever parses. Any
/// panic is a finding: the parser must refuse bad input with an error value, and the
/// accessors of a parsed file must not fail.
pub fn gguf_parse(data: &[u8]) {
    match Gguf::parse(data) {
        Ok(g) => touch(&g, data),
        Err(e) => {
            assert!(e.offset() <= data.len() as u64, "{e}");
            let _ = e.kind().name();
            let _ = e.name();
            let _ = format!("{e} {e:?}");
        }
    }
    // Header-only parsing: the first half as the prefix of a file of the full length.
    let half = data.get(..data.len() / 2).unwrap_or(data);
    if let Ok(g) = Gguf::parse_prefix(half, data.len() as u64) {
        touch(&g, data);
    }
    // A claimed length beyond the bytes given.
    if let Ok(g) = Gguf::parse_prefix(data, data.len() as u64 * 2 + 7) {
        for t in g.tensors() {
            let _ = g.tensor_data(&t);
            let _ = t.data(data);
        }
    }
}

fn touch(g: &Gguf<'_>, file: &[u8]) {
    let _ = format!("{g:?}");
    let _ = (
        g.version(),
        g.alignment(),
        g.data_offset(),
        g.file_len(),
        g.bytes(),
    );
    let mut n = 0;
    for (k, v) in g.metadata() {
        n += 1;
        touch_value(&v);
        assert_eq!(g.get(k).map(|v| v.value_type()), Some(v.value_type()));
        getters::call_every_getter(g, k);
    }
    assert_eq!(n, g.metadata_count());
    let mut n = 0;
    for t in g.tensors() {
        assert_eq!(t.index(), n);
        n += 1;
        let r = t.byte_range();
        assert!(r.end as u64 <= g.file_len());
        assert_eq!(r.len(), t.n_bytes());
        assert!(t.n_dims() <= 4 && t.dims().len() == t.n_dims());
        assert_eq!(t.offset() % u64::from(g.alignment()), 0);
        let _ = (t.name(), t.ne(), t.dtype(), t.n_elements(), t.data(file));
        if let Some(d) = g.tensor_data(&t) {
            assert_eq!(d.len(), t.n_bytes());
        }
        assert_eq!(g.tensor(t.name()).map(|x| x.index()), Some(t.index()));
    }
    assert_eq!(n, g.tensor_count());
    assert!(g.tensor_at(n).is_none());
    let _ = g.check_packed_layout();
}

fn touch_value(v: &Value<'_>) {
    let _ = v.value_type();
    getters::call_every_conversion(v);
    if let Some(a) = v.as_array() {
        touch_array(&a);
    }
}

fn touch_array(a: &ArrayValue<'_>) {
    let _ = (
        a.elem_type(),
        a.is_empty(),
        a.depth(),
        a.raw_bytes(),
        format!("{a:?}"),
    );
    let mut n = 0;
    for e in a.iter() {
        assert_eq!(e.value_type(), a.elem_type());
        touch_value(&e);
        n += 1;
    }
    assert_eq!(n, a.len());
    if let Some(s) = a.strings() {
        assert_eq!(s.count(), a.len());
    }
    macro_rules! nums {
        ($($t:ty),*) => {$(
            if let Some(it) = a.numbers::<$t>() {
                assert_eq!(it.count(), a.len());
                let mut buf = [<$t>::default(); 3];
                assert_eq!(a.copy_into(&mut buf[..]), Some(a.len().min(3)));
            }
        )*};
    }
    nums!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, bool);
    if let Some(arrs) = a.arrays() {
        assert_eq!(arrs.count(), a.len());
    }
    assert!(a.get(a.len()).is_none());
    if !a.is_empty() {
        assert!(a.get(a.len() - 1).is_some());
    }
}
