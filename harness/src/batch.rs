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
    /// F16 mask `[n_kv, n_tokens]`.
    pub mask: Vec<u8>,
    /// I32 output row ids.
    pub out_ids: Vec<u8>,
}

/// Claims cache cells for `batch` (appending after the cells in use) and computes the
/// graph inputs: the causal mask lets token `i` see every cell of its own sequence at a
/// position `<=` its own.
pub fn prepare(kv: &mut KvCache, batch: &Batch) -> Result<GraphInputs> {
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
    for i in 0..n {
        kv.cell_pos[kv_head + i] = Some((batch.pos[i], batch.seq[i]));
    }
    let n_kv = (kv_head + n).div_ceil(256) * 256;
    let n_kv = n_kv.min(kv.size);
    let mut mask = Vec::with_capacity(n_kv * n * 2);
    for i in 0..n {
        for j in 0..n_kv {
            let visible =
                matches!(kv.cell_pos[j], Some((p, s)) if s == batch.seq[i] && p <= batch.pos[i]);
            let v = if visible {
                f16::ZERO
            } else {
                f16::NEG_INFINITY
            };
            mask.extend_from_slice(&v.to_le_bytes());
        }
    }
    let i32s = |v: &mut dyn Iterator<Item = i32>| v.flat_map(i32::to_le_bytes).collect::<Vec<u8>>();
    let out_ids = i32s(&mut (0..n as i32).filter(|&i| batch.output[i as usize]));
    Ok(GraphInputs {
        shape: BatchShape {
            n_tokens: n,
            n_kv,
            kv_head,
            n_outputs: batch.n_outputs(),
        },
        tokens: i32s(&mut batch.tokens.iter().map(|&t| t as i32)),
        pos: i32s(&mut batch.pos.iter().copied()),
        mask,
        out_ids,
    })
}
