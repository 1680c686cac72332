//! Batches of tokens and the inputs a forward graph needs from them.

use half::f16;

use crate::error::{HarnessError, Result};
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
    /// I32 output row ids.
    pub out_ids: Vec<u8>,
    /// Whether the logits are wanted. A micro-batch whose tokens request none still
    /// computes its last token's (so every micro-batch has the same graph), and these
    /// are dropped.
    pub wanted: bool,
}

/// Claims cache cells for `batch` (appending after the cells in use) and computes the
/// inputs of the forward passes of its micro-batches of at most `n_ubatch` tokens (0:
/// one pass for the whole batch). The causal mask lets token `i` see every cell of its
/// own sequence at a position `<=` its own.
///
/// Every micro-batch of a batch attends the same `n_kv` cells (those the whole batch
/// needs, a multiple of 256), and all but a shorter last one have the same token and
/// output counts, so they share one graph: the scheduler runs them back to back in
/// rotating pipeline slots. Masked cells are skipped by the attention kernels, so a
/// token's result does not depend on how the batch was cut.
pub fn prepare(kv: &mut KvCache, batch: &Batch, n_ubatch: usize) -> Result<Vec<GraphInputs>> {
    let n = batch.len();
    if n == 0 {
        return Err(HarnessError::Usage("empty batch".into()));
    }
    if batch.n_outputs() == 0 {
        return Err(HarnessError::Usage(
            "a batch must request at least one output".into(),
        ));
    }
    let kv_head = kv
        .cell_pos
        .iter()
        .rposition(Option::is_some)
        .map_or(0, |i| i + 1);
    if kv_head + n > kv.size {
        return Err(HarnessError::Usage(format!(
            "KV cache full: {kv_head} cells used, {n} more needed, {} available",
            kv.size
        )));
    }
    let n_kv = ((kv_head + n).div_ceil(256) * 256).min(kv.size);
    let step = if n_ubatch == 0 { n } else { n_ubatch };
    let mut out = Vec::with_capacity(n.div_ceil(step));
    for u0 in (0..n).step_by(step) {
        let u1 = (u0 + step).min(n);
        let cells = kv_head + u0..kv_head + u1;
        for (c, i) in cells.clone().zip(u0..u1) {
            kv.cell_pos[c] = Some((batch.pos[i], batch.seq[i]));
        }
        let mut mask = Vec::with_capacity(n_kv * (u1 - u0) * 2);
        for i in u0..u1 {
            for j in 0..n_kv {
                let visible = matches!(kv.cell_pos[j],
                    Some((p, s)) if s == batch.seq[i] && p <= batch.pos[i]);
                let v = if visible {
                    f16::ZERO
                } else {
                    f16::NEG_INFINITY
                };
                mask.extend_from_slice(&v.to_le_bytes());
            }
        }
        let i32s =
            |v: &mut dyn Iterator<Item = i32>| v.flat_map(i32::to_le_bytes).collect::<Vec<u8>>();
        let mut rows: Vec<i32> = (0..(u1 - u0) as i32)
            .filter(|&i| batch.output[u0 + i as usize])
            .collect();
        let wanted = !rows.is_empty();
        if !wanted {
            rows.push((u1 - u0 - 1) as i32);
        }
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
            out_ids: i32s(&mut rows.into_iter()),
            wanted,
        });
    }
    Ok(out)
}
