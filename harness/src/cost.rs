//! A cost model of the all-gathers that feed products in the exact tensor split: how much
//! copy time a device spends waiting, whole (`--all-gather concat`) or pipelined by token
//! chunks (`--all-gather ring`), for `n` devices on a given link.
//!
//! Each device holds `features / n` rows of the activation for every token and needs all
//! of them; it receives `(n - 1) / n` of the tensor, as `n - 1` messages over its own
//! link (a ring: `n - 1` hops of one slice each). With `concat` the product waits for
//! all of it. With `ring` the tokens are cut into `n` chunks: chunk `k` arrives after
//! `k + 1` chunk copies (the link is busy back to back), its product starts when both it
//! and the previous chunk's product are done, and only the device's idle time before
//! each product is exposed.
//!
//! The ring pays the link's latency once per chunk and hop, so where the products are
//! much shorter than the copies (fast GPUs, narrow layers) it exposes more than one whole
//! gather; the tables' last column (exposed ring / exposed concat) says which wins.

use std::fmt::Write as _;

/// A link between devices, per direction and device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Name for tables.
    pub name: &'static str,
    /// Bytes per second one device receives.
    pub bytes_per_s: f64,
    /// Fixed cost of one message, seconds.
    pub latency_s: f64,
}

/// Links of the paper table: achieved (not peak) unidirectional rates per GPU, and the
/// launch-to-data latency of one peer copy.
pub const LINKS: [Link; 3] = [
    Link {
        name: "PCIe 4 x16",
        bytes_per_s: 25e9,
        latency_s: 10e-6,
    },
    Link {
        name: "PCIe 5 x16",
        bytes_per_s: 50e9,
        latency_s: 8e-6,
    },
    Link {
        name: "NVLink 4",
        bytes_per_s: 350e9,
        latency_s: 3e-6,
    },
];

/// One all-gather feeding a product: the gathered activation has `features` rows per
/// token, the product `rows` output rows in all (each device computes `rows / n`).
#[derive(Clone, Debug, PartialEq)]
pub struct GatherShape {
    /// Name for tables (`attn_gather`, `ffn_gather`).
    pub name: String,
    /// Rows of the gathered activation.
    pub features: usize,
    /// Output rows of the product, over all devices.
    pub rows: usize,
    /// Tokens of the pass.
    pub tokens: usize,
    /// Bytes per activation element on the wire (4: F32).
    pub elem_bytes: usize,
}

/// What the model predicts for one gather.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// Token chunks of the ring (`min(n, tokens)`).
    pub chunks: usize,
    /// Bytes one device receives.
    pub bytes_received: f64,
    /// Time to receive everything, seconds (`concat`'s exposed time).
    pub copy_s: f64,
    /// Time to receive one chunk, seconds.
    pub chunk_copy_s: f64,
    /// One chunk's product on one device, seconds.
    pub chunk_product_s: f64,
    /// Exposed copy time with `concat`, seconds.
    pub exposed_concat_s: f64,
    /// Exposed copy time with `ring`, seconds.
    pub exposed_ring_s: f64,
}

/// Exposed time of a pipeline of `chunks` copies of `copy_s` each, back to back on one
/// link, each followed by a product of `product_s` once the previous product is done.
pub fn pipeline_exposed(chunks: usize, copy_s: f64, product_s: f64) -> f64 {
    let (mut done, mut exposed) = (0.0f64, 0.0f64);
    for k in 0..chunks {
        let arrived = (k + 1) as f64 * copy_s;
        let start = arrived.max(done);
        exposed += start - done;
        done = start + product_s;
    }
    exposed
}

/// Predicts the exposed copy time of `g` on `n` devices over `link`, the products running
/// at `flops_per_s` on each device.
pub fn predict(g: &GatherShape, n: usize, link: &Link, flops_per_s: f64) -> Prediction {
    let nf = n.max(1) as f64;
    let bytes = (g.features * g.tokens * g.elem_bytes) as f64;
    let received = bytes * (nf - 1.0) / nf;
    let messages = nf - 1.0;
    let copy_s = messages * link.latency_s + received / link.bytes_per_s;
    let chunks = n.min(g.tokens).max(1);
    let chunk_copy_s = messages * link.latency_s + received / chunks as f64 / link.bytes_per_s;
    let product_s = 2.0 * g.features as f64 * g.rows as f64 / nf * g.tokens as f64 / flops_per_s;
    let chunk_product_s = product_s / chunks as f64;
    let (exposed_concat_s, exposed_ring_s) = if n <= 1 {
        (0.0, 0.0)
    } else {
        (
            copy_s,
            pipeline_exposed(chunks, chunk_copy_s, chunk_product_s),
        )
    };
    Prediction {
        chunks,
        bytes_received: received,
        copy_s,
        chunk_copy_s,
        chunk_product_s,
        exposed_concat_s,
        exposed_ring_s,
    }
}

/// The two gathers of a layer that feed products: the attention heads before the output
/// projection, and the FFN activation before the down matrix.
pub fn layer_gathers(n_embd: usize, n_q: usize, n_ff: usize, tokens: usize) -> Vec<GatherShape> {
    vec![
        GatherShape {
            name: "attn_gather".into(),
            features: n_q,
            rows: n_embd,
            tokens,
            elem_bytes: 4,
        },
        GatherShape {
            name: "ffn_gather".into(),
            features: n_ff,
            rows: n_embd,
            tokens,
            elem_bytes: 4,
        },
    ]
}

/// A Markdown table of [`predict`] for every gather, device count and link, in µs per
/// layer.
pub fn table(
    gathers: &[GatherShape],
    devices: &[usize],
    links: &[Link],
    flops_per_s: f64,
) -> String {
    let mut s = format!(
        "cost model at {:.0} TFLOP/s per device, F32 activations on the wire (µs per layer)\n\n\
         | gather | devices | link | received KiB | copy | chunk copy | chunk product | exposed concat | exposed ring | ring / concat |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        flops_per_s / 1e12
    );
    for g in gathers {
        for &n in devices {
            for l in links {
                let p = predict(g, n, l, flops_per_s);
                let ratio = match p.exposed_concat_s > 0.0 {
                    true => format!("{:.2}", p.exposed_ring_s / p.exposed_concat_s),
                    false => "-".to_string(),
                };
                let _ = writeln!(
                    s,
                    "| {} [{}x{}] | {n} | {} | {:.0} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {ratio} |",
                    g.name,
                    g.features,
                    g.tokens,
                    l.name,
                    p.bytes_received / 1024.0,
                    p.copy_s * 1e6,
                    p.chunk_copy_s * 1e6,
                    p.chunk_product_s * 1e6,
                    p.exposed_concat_s * 1e6,
                    p.exposed_ring_s * 1e6,
                );
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn products_longer_than_copies_hide_all_but_the_first_chunk() {
        assert_eq!(pipeline_exposed(4, 1.0, 2.0), 1.0);
        // Copy-bound: the device waits for the link after every product.
        assert_eq!(pipeline_exposed(4, 2.0, 1.0), 2.0 + 3.0 * 1.0);
        assert_eq!(pipeline_exposed(1, 3.0, 5.0), 3.0);
    }

    #[test]
    fn one_device_copies_nothing() {
        let g = &layer_gathers(576, 576, 1536, 512)[0];
        let p = predict(g, 1, &LINKS[0], 1e12);
        assert_eq!((p.exposed_concat_s, p.exposed_ring_s), (0.0, 0.0));
        assert_eq!(p.bytes_received, 0.0);
    }

    #[test]
    fn smollm2_on_two_devices_by_hand() {
        // 1536 x 512 F32 = 3 MiB; one device receives half over 50 GB/s plus 8 µs.
        let g = &layer_gathers(576, 576, 1536, 512)[1];
        let p = predict(g, 2, &LINKS[1], 1e12);
        let want = 8e-6 + 1536.0 * 512.0 * 4.0 / 2.0 / 50e9;
        assert!((p.copy_s - want).abs() < 1e-12, "{p:?}");
        assert_eq!(p.chunks, 2);
        let t = table(std::slice::from_ref(g), &[2, 8], &LINKS, 400e12);
        assert!(
            t.contains("| ffn_gather [1536x512] | 8 | NVLink 4 |"),
            "{t}"
        );
    }

    proptest! {
        /// The ring never exposes more than the whole gather, and never less than one
        /// chunk's copy.
        #[test]
        fn ring_is_bounded(
            features in 1usize..20_000,
            rows in 1usize..20_000,
            tokens in 1usize..10_000,
            n in 2usize..9,
            link in 0usize..3,
            tflops in 1.0f64..1000.0,
        ) {
            let g = GatherShape { name: "g".into(), features, rows, tokens, elem_bytes: 4 };
            let p = predict(&g, n, &LINKS[link], tflops * 1e12);
            prop_assert!(p.exposed_ring_s <= p.exposed_concat_s + 1e-12 + (n as f64 - 1.0) * LINKS[link].latency_s * (p.chunks as f64 - 1.0));
            prop_assert!(p.exposed_ring_s + 1e-15 >= p.chunk_copy_s);
        }
    }
}
