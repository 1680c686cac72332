//! Batches of tokens and the inputs a forward graph needs from them.

use half::f16;

use crate::error::{ModelError, Result};
use crate::model::BatchShape;
use crate::placement::KvCache;

/// Tokens to decode together, each with its position, sequence and whether its logits
/// are wanted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Position of each token in its sequence.
    pub pos: Vec<i32>,
    /// Sequence of each token.
    pub seq: Vec<u32>,
    /// Whether each token's logits are returned.
    pub output: Vec<bool>,
}

impl Batch {
    /// Appends one token.
    pub fn push(&mut self, token: u32, pos: i32, seq: u32, output: bool) {
        self.tokens.push(token);
        self.pos.push(pos);
        self.seq.push(seq);
        self.output.push(output);
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Number of tokens whose logits are wanted.
    pub fn n_outputs(&self) -> usize {
        self.output.iter().filter(|&&o| o).count()
    }
}

/// Bytes of every input tensor of one forward pass.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphInputs {
    /// The geometry the graph must be built for.
    pub shape: BatchShape,
    /// I32 token ids.
    pub tokens: Vec<u8>,
    /// I32 positions.
    pub pos: Vec<u8>,
    /// I32 KV cell written by each token.
    pub kv_idxs: Vec<u8>,
    /// F16 mask `[n_kv, n_tokens]`.
    pub mask: Vec<u8>,
    /// F16 mask `[n_kv, n_tokens]` of the sliding-window layers (empty when the cache's
    /// model has none): the causal mask without the cells `n_swa` or more positions
    /// back (llama.cpp's standard window: `pos - p >= n_swa` is masked).
    pub mask_swa: Vec<u8>,
    /// I32 output row ids.
    pub out_ids: Vec<u8>,
    /// How many of the computed logit rows (the first ones) were requested. Every
    /// micro-batch of a batch computes as many rows as the one with the most outputs (a
    /// shorter list repeats its last row, a micro-batch without outputs computes its last
    /// token's), so that all share one graph and none waits for a rebuild; the extra rows
    /// are dropped.
    pub wanted_rows: usize,
}

/// The KV cells a pass attends are the cells in use rounded up to a multiple of this, so
/// that one graph serves 128 consecutive decode steps. 128 is the CUDA decode attention's
/// tile: a generation of up to 128 tokens attends one tile, which is its own combine.
/// The bits do not depend on it: every kernel skips masked cells and orders its sums by
/// position.
pub const KV_PAD: usize = 128;

/// Claims cache cells for `batch` (appending after the cells in use) and computes the
/// inputs of the forward passes of its micro-batches of at most `n_ubatch` tokens (0:
/// one pass for the whole batch). The causal mask lets token `i` see every cell of its
/// own sequence at a position `<=` its own.
///
/// Every micro-batch of a batch attends the same `n_kv` cells (those the whole batch
/// needs, a multiple of [`KV_PAD`]), and all but a shorter last one have the same token and
/// output counts, so they share one graph: the scheduler runs them back to back in
/// rotating pipeline slots. Masked cells are skipped by the attention kernels, so a
/// token's result does not depend on how the batch was cut.
pub fn prepare(kv: &mut KvCache, batch: &Batch, n_ubatch: usize) -> Result<Vec<GraphInputs>> {
    let n = batch.len();
    if n == 0 {
        return Err(ModelError::Usage("empty batch".into()));
    }
    if batch.n_outputs() == 0 {
        return Err(ModelError::Usage(
            "a batch must request at least one output".into(),
        ));
    }
    let kv_head = kv
        .cell_pos
        .iter()
        .rposition(Option::is_some)
        .map_or(0, |i| i + 1);
    if kv_head + n > kv.size {
        return Err(ModelError::Usage(format!(
            "KV cache full: {kv_head} cells used, {n} more needed, {} available",
            kv.size
        )));
    }
    let n_kv = ((kv_head + n).div_ceil(KV_PAD) * KV_PAD).min(kv.size);
    let step = if n_ubatch == 0 { n } else { n_ubatch };
    let mut out = Vec::with_capacity(n.div_ceil(step));
    for u0 in (0..n).step_by(step) {
        let u1 = (u0 + step).min(n);
        let cells = kv_head + u0..kv_head + u1;
        for (c, i) in cells.clone().zip(u0..u1) {
            kv.cell_pos[c] = Some((batch.pos[i], batch.seq[i]));
        }
        let swa = kv.n_swa;
        let mut mask = Vec::with_capacity(n_kv * (u1 - u0) * 2);
        let mut mask_swa = Vec::with_capacity(if swa > 0 { mask.capacity() } else { 0 });
        let bit = |visible: bool| {
            if visible {
                f16::ZERO
            } else {
                f16::NEG_INFINITY
            }
            .to_le_bytes()
        };
        for i in u0..u1 {
            for j in 0..n_kv {
                let seen = match kv.cell_pos[j] {
                    Some((p, s)) if s == batch.seq[i] && p <= batch.pos[i] => Some(p),
                    _ => None,
                };
                mask.extend_from_slice(&bit(seen.is_some()));
                if swa > 0 {
                    let near = seen.is_some_and(|p| ((batch.pos[i] - p) as usize) < swa);
                    mask_swa.extend_from_slice(&bit(near));
                }
            }
        }
        let i32s =
            |v: &mut dyn Iterator<Item = i32>| v.flat_map(i32::to_le_bytes).collect::<Vec<u8>>();
        let rows: Vec<i32> = (0..(u1 - u0) as i32)
            .filter(|&i| batch.output[u0 + i as usize])
            .collect();
        out.push(GraphInputs {
            shape: BatchShape {
                n_tokens: u1 - u0,
                n_kv,
                n_outputs: rows.len(),
            },
            tokens: i32s(&mut batch.tokens[u0..u1].iter().map(|&t| t as i32)),
            pos: i32s(&mut batch.pos[u0..u1].iter().copied()),
            kv_idxs: i32s(&mut cells.map(|c| c as i32)),
            mask,
            mask_swa,
            out_ids: i32s(&mut rows.iter().copied()),
            wanted_rows: rows.len(),
        });
    }
    // One row count for the whole batch (see `wanted_rows`).
    let n_rows = out.iter().map(|g| g.wanted_rows).max().unwrap_or(0).max(1);
    for g in &mut out {
        let len = g.shape.n_tokens;
        let last = match g.wanted_rows {
            0 => (len - 1) as i32,
            k => i32::from_le_bytes(g.out_ids[4 * (k - 1)..4 * k].try_into().expect("4 bytes")),
        };
        // A last micro-batch shorter than the others names at most one row per token.
        for _ in g.wanted_rows..n_rows.min(len).max(g.wanted_rows) {
            g.out_ids.extend_from_slice(&last.to_le_bytes());
        }
        g.shape.n_outputs = g.out_ids.len() / 4;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(b: &[u8]) -> Vec<i32> {
        b.chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Ten tokens, logits wanted for the last three (as perplexity scores a chunk's end).
    fn batch() -> Batch {
        let mut b = Batch::default();
        for i in 0..10 {
            b.push(100 + i, i as i32, 0, i >= 7);
        }
        b
    }

    #[test]
    fn micro_batches_share_one_shape_and_cover_the_batch() {
        let mut kv = KvCache::cells_only(512);
        let u = prepare(&mut kv, &batch(), 4).unwrap();
        assert_eq!(u.len(), 3);
        // Same n_kv everywhere, and the row count of the one with most outputs (2).
        let shapes: Vec<_> = u.iter().map(|g| g.shape).collect();
        for (g, n) in shapes.iter().zip([4, 4, 2]) {
            assert_eq!((g.n_tokens, g.n_kv), (n, KV_PAD));
        }
        assert_eq!(shapes[0], shapes[1]);
        assert_eq!(
            u.iter().map(|g| g.wanted_rows).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        // No output wanted: the last token, repeated; wanted rows first, then repeats.
        assert_eq!(ints(&u[0].out_ids), [3, 3]);
        assert_eq!(ints(&u[1].out_ids), [3, 3]);
        assert!(shapes.iter().all(|g| g.n_outputs == 2));
        assert_eq!(ints(&u[2].out_ids), [0, 1]);
        assert_eq!(ints(&u[1].kv_idxs), [4, 5, 6, 7]);
        assert_eq!(ints(&u[2].tokens), [108, 109]);
        // Token 5 (micro-batch 1, row 1) sees cells 0..=5 and nothing else.
        let mask = &u[1].mask;
        let visible: Vec<usize> = (0..KV_PAD)
            .filter(|&j| {
                let at = 2 * (KV_PAD + j);
                f16::from_le_bytes([mask[at], mask[at + 1]]) == f16::ZERO
            })
            .collect();
        assert_eq!(visible, (0..=5).collect::<Vec<_>>());
    }

    /// The attended cells grow in steps of `KV_PAD` and stop at the cache's size.
    #[test]
    fn attended_cells_are_the_used_ones_rounded_up_to_the_pad() {
        let mut kv = KvCache::cells_only(384);
        let mut seen = Vec::new();
        for pos in 0..300 {
            let mut b = Batch::default();
            b.push(1, pos, 0, true);
            seen.push(prepare(&mut kv, &b, 0).unwrap()[0].shape.n_kv);
        }
        assert_eq!(seen[0], 128);
        assert_eq!(seen[127], 128);
        assert_eq!(seen[128], 256);
        assert_eq!(seen[255], 256);
        assert_eq!(seen[256], 384);
        assert_eq!(seen[299], 384);
    }

    #[test]
    fn one_pass_without_micro_batches_and_clear_errors() {
        let mut kv = KvCache::cells_only(256);
        let u = prepare(&mut kv, &batch(), 0).unwrap();
        assert_eq!(u.len(), 1);
        assert_eq!((u[0].shape.n_outputs, u[0].wanted_rows), (3, 3));
        assert_eq!(ints(&u[0].out_ids), [7, 8, 9]);
        let mut full = KvCache::cells_only(256);
        let mut big = Batch::default();
        for i in 0..300 {
            big.push(1, i, 0, true);
        }
        let e = prepare(&mut full, &big, 0).unwrap_err().to_string();
        assert!(e.contains("KV cache full"), "{e}");
        let e = prepare(&mut full, &Batch::default(), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty batch"), "{e}");
    }
}
