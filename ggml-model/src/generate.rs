//! `generate`: text continuation with greedy decoding (default) or seeded sampling,
//! as llama.cpp's `llama-simple` (greedy) and its common sampler chain do it.

use std::time::{Duration, Instant};

use crate::batch::Batch;
use crate::error::{ModelError, Result};
use crate::executor::Executor;
use crate::placement::KvCache;
use crate::session::Session;
use crate::tokenizer::Tokenizer;

/// How the next token is chosen from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Temperature; 0 (the default) is greedy: the highest logit, the first on ties.
    pub temp: f32,
    /// Keep only the `top_k` highest logits (0: all).
    pub top_k: usize,
    /// Keep the smallest set of highest-probability tokens whose probabilities add up
    /// to at least `top_p` (1: all).
    pub top_p: f32,
    /// Seed of the random draws.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> SamplerConfig {
        SamplerConfig {
            temp: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// Picks tokens from logits: greedy, or top-k, then top-p (on probabilities at
/// temperature 1), then temperature, then a seeded draw, in llama.cpp's chain order.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: crate::synthetic::Rng,
    record_gaps: bool,
}

impl Sampler {
    /// A sampler; refuses a negative or non-finite temperature and `top_p` outside
    /// `(0, 1]`.
    pub fn new(cfg: SamplerConfig) -> Result<Sampler> {
        if !(cfg.temp >= 0.0 && cfg.temp.is_finite()) {
            return Err(ModelError::Usage(format!(
                "--temp {}: must be finite and >= 0",
                cfg.temp
            )));
        }
        if !(cfg.top_p > 0.0 && cfg.top_p <= 1.0) {
            return Err(ModelError::Usage(format!(
                "--top-p {}: must be in (0, 1]",
                cfg.top_p
            )));
        }
        Ok(Sampler {
            cfg,
            rng: crate::synthetic::Rng(cfg.seed),
            record_gaps: false,
        })
    }

    /// Makes [`generate`] read back every pass's logits, even when greedy, and record
    /// each generated token's [`top_gap`] in [`Generation::gaps`]: how near the choice
    /// was to a tie, so that two kernel orders' greedy texts can be told apart from a
    /// near tie decided either way.
    pub fn record_gaps(mut self) -> Sampler {
        self.record_gaps = true;
        self
    }

    /// Whether the sampler is greedy (temperature 0): its token is [`argmax`] of the
    /// logits, which an executor can compute where the logits are
    /// ([`Executor::forward_greedy`]).
    pub fn is_greedy(&self) -> bool {
        self.cfg.temp == 0.0
    }

    /// Uniform in `[0, 1)`.
    fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.is_greedy() {
            return argmax(logits);
        }
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as u32, l))
            .collect();
        // Highest first; ties by id, so the order (and the draw) is reproducible.
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.cfg.top_k > 0 {
            cand.truncate(self.cfg.top_k);
        }
        if self.cfg.top_p < 1.0 {
            let probs = softmax(&cand, 1.0);
            let mut acc = 0.0;
            let mut keep = cand.len();
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= f64::from(self.cfg.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        let probs = softmax(&cand, self.cfg.temp);
        let r = self.uniform();
        let mut acc = 0.0;
        for (c, p) in cand.iter().zip(&probs) {
            acc += p;
            if r < acc {
                return c.0;
            }
        }
        cand.last().map_or(0, |c| c.0)
    }
}

/// What a pass gives the sampler: the greedy token, or the logits to sample from.
enum Next {
    Token(u32),
    Logits(Vec<f32>),
}

/// The highest logit minus the second highest (NaNs left out; 0 for fewer than two
/// finite-or-infinite logits, `inf` when only the best is infinite).
pub fn top_gap(logits: &[f32]) -> f32 {
    let (mut best, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    let mut n = 0;
    for &l in logits.iter().filter(|l| !l.is_nan()) {
        n += 1;
        if l > best {
            (best, second) = (l, best);
        } else if l > second {
            second = l;
        }
    }
    match n {
        0 | 1 => 0.0,
        _ if best == second => 0.0,
        _ => best - second,
    }
}

/// How two greedy runs of one prompt compare, token by token ([`compare_greedy`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GreedyAgreement {
    /// The same tokens as far as the shorter run goes (`n` of them).
    Same {
        /// Tokens compared.
        n: usize,
    },
    /// The first different token comes where either run had its best logit less than
    /// the near-tie bound above the runner-up: a choice another summation order may
    /// make the other way. Past it the runs continue different texts, not compared.
    NearTie {
        /// Index of the first different generated token.
        at: usize,
        /// [`top_gap`] of each run there.
        gaps: [f32; 2],
    },
    /// The first different token comes where both runs were clear of a tie.
    Differs {
        /// Index of the first different generated token.
        at: usize,
        /// [`top_gap`] of each run there.
        gaps: [f32; 2],
    },
}

/// Compares two greedy runs' tokens with the [`top_gap`]s each recorded
/// ([`Generation::gaps`]): the same tokens, or a first difference at a near tie (either
/// gap below `near_tie`), or a difference neither run was near to. A run without a gap
/// for a token counts as clear of a tie there.
pub fn compare_greedy(tokens: [&[u32]; 2], gaps: [&[f32]; 2], near_tie: f32) -> GreedyAgreement {
    let n = tokens[0].len().min(tokens[1].len());
    let Some(at) = (0..n).find(|&i| tokens[0][i] != tokens[1][i]) else {
        return GreedyAgreement::Same { n };
    };
    let gaps = gaps.map(|g| g.get(at).copied().unwrap_or(f32::INFINITY));
    if gaps.iter().any(|&g| g < near_tie) {
        GreedyAgreement::NearTie { at, gaps }
    } else {
        GreedyAgreement::Differs { at, gaps }
    }
}

/// The index of the highest logit, the first one on ties (llama.cpp's greedy sampler):
/// the CPU backend's ARGMAX scan, [`ggml_cpu::reference::argmax_row`] (a NaN never wins;
/// 0 for no logits).
pub fn argmax(logits: &[f32]) -> u32 {
    ggml_cpu::reference::argmax_row(logits) as u32
}

/// Probabilities of sorted candidates at temperature `temp`.
fn softmax(cand: &[(u32, f32)], temp: f32) -> Vec<f64> {
    let max = cand.first().map_or(0.0, |c| f64::from(c.1));
    let e: Vec<f64> = cand
        .iter()
        .map(|c| ((f64::from(c.1) - max) / f64::from(temp)).exp())
        .collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

/// Texts of control tokens that end generation besides EOS (as llama.cpp's end-of-
/// generation set: chat turn ends).
const END_TEXTS: [&str; 6] = [
    "<end_of_turn>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|endoftext|>",
    "<|end|>",
    "<EOT>",
];

/// Whether `id` ends generation: EOS, or a control token that ends a turn.
pub fn is_end_of_generation(tok: &Tokenizer, id: u32) -> bool {
    tok.eos() == Some(id)
        || (tok.token_type(id) == Some(crate::tokenizer::TOKEN_TYPE_CONTROL)
            && tok.token_text(id).is_some_and(|t| END_TEXTS.contains(&t)))
}

/// What [`generate`] produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// Prompt token ids (BOS included where the vocabulary adds it).
    pub prompt: Vec<u32>,
    /// Generated token ids (without the end-of-generation token, if one came).
    pub tokens: Vec<u32>,
    /// Whether generation stopped at an end-of-generation token.
    pub ended: bool,
    /// Per generated token, [`top_gap`] of the logits it was chosen from; empty unless
    /// the sampler was made with [`Sampler::record_gaps`].
    pub gaps: Vec<f32>,
    /// Time to process the prompt.
    pub prompt_time: Duration,
    /// Time to generate the tokens after the first.
    pub gen_time: Duration,
}

impl Generation {
    /// Generated tokens per second (every token after the prompt pass; 0 if none).
    pub fn tokens_per_second(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        match self.gen_time.as_secs_f64() {
            s if n > 0 && s > 0.0 => n as f64 / s,
            _ => 0.0,
        }
    }

    /// Prompt tokens per second.
    pub fn prompt_tokens_per_second(&self) -> f64 {
        match self.prompt_time.as_secs_f64() {
            s if s > 0.0 => self.prompt.len() as f64 / s,
            _ => 0.0,
        }
    }
}

/// Continues `prompt` by up to `n_gen` tokens: the prompt in one batch, then one token
/// per pass, stopping early at an end-of-generation token. `on_token` gets each new
/// token's bytes as it is produced (a UTF-8 character may span tokens).
pub fn generate(
    session: &Session,
    exec: &mut dyn Executor,
    kv: &mut KvCache,
    prompt: &str,
    n_gen: usize,
    sampler: &mut Sampler,
    mut on_token: impl FnMut(u32, &[u8]) -> Result<()>,
) -> Result<Generation> {
    let (model, tok) = (&session.model, &session.tokenizer);
    let ids = tok.encode(prompt);
    if ids.is_empty() {
        return Err(ModelError::Usage(
            "the prompt is empty and the vocabulary adds no BOS".into(),
        ));
    }
    if ids.len() + n_gen > kv.size {
        return Err(ModelError::Usage(format!(
            "{} prompt tokens + {n_gen} to generate exceed the {} cache cells",
            ids.len(),
            kv.size
        )));
    }
    kv.clear();
    let t0 = Instant::now();
    let mut batch = Batch::default();
    for (i, &t) in ids.iter().enumerate() {
        batch.push(t, i as i32, 0, i + 1 == ids.len());
    }
    // Greedy decoding needs only each pass's best token: the executor computes it where
    // the logits are (a GPU returns 4 bytes per token). Sampling and gaps need the logits.
    let greedy = sampler.is_greedy() && !sampler.record_gaps;
    let pass = |exec: &mut dyn Executor, kv: &mut KvCache, b: &Batch| -> Result<Next> {
        Ok(match greedy {
            true => Next::Token(exec.forward_greedy(model, kv, b)?[0]),
            false => Next::Logits(exec.forward(model, kv, b)?),
        })
    };
    let mut next_of = pass(exec, kv, &batch)?;
    let prompt_time = t0.elapsed();
    let t1 = Instant::now();
    let mut out = Vec::with_capacity(n_gen);
    let mut gaps = Vec::new();
    let mut ended = false;
    for i in 0..n_gen {
        let (next, gap) = match &next_of {
            Next::Token(t) => (*t, None),
            Next::Logits(l) => {
                let row = &l[..model.hp.n_vocab];
                let gap = sampler.record_gaps.then(|| top_gap(row));
                (sampler.sample(row), gap)
            }
        };
        if is_end_of_generation(tok, next) {
            ended = true;
            break;
        }
        out.push(next);
        gaps.extend(gap);
        on_token(next, &tok.decode_bytes(&[next]))?;
        if i + 1 == n_gen {
            break;
        }
        let mut b = Batch::default();
        b.push(next, (ids.len() + i) as i32, 0, true);
        next_of = pass(exec, kv, &b)?;
    }
    Ok(Generation {
        prompt: ids,
        tokens: out,
        ended,
        gaps,
        prompt_time,
        gen_time: t1.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_highest() {
        assert_eq!(argmax(&[0.0, 2.0, 1.0, 2.0]), 1);
        // A NaN never wins; a NaN first holds the scan at 0; no logits give 0.
        assert_eq!(argmax(&[1.0, f32::NAN, 3.0, f32::NAN]), 2);
        assert_eq!(argmax(&[f32::NAN, 5.0]), 0);
        assert_eq!(argmax(&[]), 0);
        let mut s = Sampler::new(SamplerConfig::default()).unwrap();
        assert_eq!(s.sample(&[-1.0, -0.5, -3.0]), 1);
    }

    #[test]
    fn the_top_gap_is_best_minus_runner_up() {
        assert_eq!(top_gap(&[0.5, 2.0, 1.25, -3.0]), 0.75);
        // A tie for the best is a gap of 0, whichever comes first.
        assert_eq!(top_gap(&[2.0, 1.0, 2.0]), 0.0);
        // NaNs are left out; fewer than two logits give 0.
        assert_eq!(top_gap(&[f32::NAN, 1.0, f32::NAN, 0.25]), 0.75);
        assert_eq!(top_gap(&[f32::NAN, 1.0]), 0.0);
        assert_eq!(top_gap(&[]), 0.0);
        assert_eq!(top_gap(&[f32::INFINITY, 1.0]), f32::INFINITY);
    }

    #[test]
    fn greedy_runs_agree_differ_or_part_at_a_near_tie() {
        let a = [5u32, 6, 7, 8];
        let gaps = [1.0f32, 0.5, 0.01, 2.0];
        assert_eq!(
            compare_greedy([&a, &a[..3]], [&gaps, &[]], 0.05),
            GreedyAgreement::Same { n: 3 }
        );
        let b = [5u32, 6, 9, 1];
        let other = [1.0f32, 0.4, 0.3, 0.2];
        // Token 2: the first run was 0.01 from a tie.
        assert_eq!(
            compare_greedy([&a, &b], [&gaps, &other], 0.05),
            GreedyAgreement::NearTie {
                at: 2,
                gaps: [0.01, 0.3]
            }
        );
        // Both clear of the bound: a difference no order explains.
        assert_eq!(
            compare_greedy([&a, &b], [&gaps, &other], 0.005),
            GreedyAgreement::Differs {
                at: 2,
                gaps: [0.01, 0.3]
            }
        );
        // No gaps recorded: never a near tie.
        assert_eq!(
            compare_greedy([&a, &b], [&[], &[]], 0.05),
            GreedyAgreement::Differs {
                at: 2,
                gaps: [f32::INFINITY, f32::INFINITY]
            }
        );
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let cfg = SamplerConfig {
            temp: 5.0,
            top_k: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.1, 0.3, 0.2]), 1);
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_sufficient_set() {
        // Probabilities at temperature 1: about 0.665, 0.245, 0.09.
        let logits = [2.0f32, 1.0, 0.0];
        let cfg = SamplerConfig {
            temp: 1.0,
            top_p: 0.8,
            seed: 7,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        let mut seen = [0usize; 3];
        for _ in 0..2000 {
            seen[s.sample(&logits) as usize] += 1;
        }
        assert_eq!(seen[2], 0, "token 2 is outside the top-p set");
        assert!(seen[0] > seen[1] && seen[1] > 0, "{seen:?}");
    }

    #[test]
    fn draws_follow_the_seed_and_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()];
        let cfg = SamplerConfig {
            temp: 1.0,
            seed: 11,
            ..Default::default()
        };
        let draw = |cfg| {
            let mut s = Sampler::new(cfg).unwrap();
            (0..4000).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        let a = draw(cfg);
        assert_eq!(a, draw(cfg), "same seed, same tokens");
        assert_ne!(a, draw(SamplerConfig { seed: 12, ..cfg }));
        let ones = a.iter().filter(|&&t| t == 1).count() as f64 / a.len() as f64;
        assert!((ones - 0.75).abs() < 0.03, "P(1) = {ones}, expected 0.75");
    }

    #[test]
    fn bad_settings_are_refused() {
        for cfg in [
            SamplerConfig {
                temp: -1.0,
                ..Default::default()
            },
            SamplerConfig {
                top_p: 0.0,
                ..Default::default()
            },
            SamplerConfig {
                top_p: 1.5,
                ..Default::default()
            },
        ] {
            assert!(Sampler::new(cfg).is_err(), "{cfg:?}");
        }
    }
}
