//! The error words of the kernels that check indices (get_rows, set_rows, mul_mat_id):
//! each launch gets a word of its own, set by the kernel when an index is out of range,
//! so an error names its op and node.
//!
//! The words live in regions of one device array, mirrored in pinned host memory:
//! - region 0 serves launches made one by one; the words handed out since the last
//!   check are copied to the mirror on the stream just before a synchronisation and
//!   read after it;
//! - each captured CUDA graph owns another region: its launches write the same words at
//!   every replay, and the graph ends with a copy of them to the mirror, so replays need
//!   no host work and the words stay set (an error is sticky) until a check reads them.
//!
//! A check reads the mirror of region 0 and of every region replayed since the last
//! check; the first word set names the error, and its region is cleared for the next
//! interval.

use ggml_core::Name;

/// Words per region: past that many launches in one region, the last word is shared.
pub(crate) const REGION_WORDS: usize = 128;

/// Who wrote which word: op and node of each word of a region, in order.
pub(crate) type Users = Vec<(&'static str, Name)>;

/// The first word set in `words` of region `users`: its op, node and whether it is the
/// shared last word.
pub(crate) fn first_set(words: &[u32], users: &Users) -> Option<(&'static str, Name, bool)> {
    let i = words
        .iter()
        .take(users.len().min(REGION_WORDS))
        .position(|&w| w != 0)?;
    let (op, node) = users[i];
    Some((op, node, i == REGION_WORDS - 1))
}

/// Region bookkeeping: which regions graphs own, which are free, and the users of region 0.
pub(crate) struct Regions {
    /// Op and node of each word of region 0 handed out since the last check.
    pub eager: Users,
    free: Vec<usize>,
    /// Regions of graphs evicted since the last check: checked once more, then freed.
    pub retired: Vec<(usize, Users)>,
    /// The region and users of the capture in progress, if any.
    pub capturing: Option<(usize, Users)>,
}

impl Regions {
    /// Region 0 and `graphs` graph regions.
    pub(crate) fn new(graphs: usize) -> Regions {
        Regions {
            eager: Vec::new(),
            free: (1..=graphs).rev().collect(),
            retired: Vec::new(),
            capturing: None,
        }
    }

    /// The index of the word for a launch of `op` (node `node`) in the region in use:
    /// the capture's, else region 0.
    pub(crate) fn slot(&mut self, op: &'static str, node: Name) -> usize {
        let (region, users) = match &mut self.capturing {
            Some((r, u)) => (*r, u),
            None => (0, &mut self.eager),
        };
        let i = users.len().min(REGION_WORDS - 1);
        if users.len() < REGION_WORDS {
            users.push((op, node));
        }
        region * REGION_WORDS + i
    }

    /// A free graph region, if any.
    pub(crate) fn take_free(&mut self) -> Option<usize> {
        self.free.pop()
    }

    /// Gives a region back at once (a capture that failed: nothing ran in it).
    pub(crate) fn give_back(&mut self, region: usize) {
        self.free.push(region);
    }

    /// Frees the retired regions (after a check read them).
    pub(crate) fn release_retired(&mut self) {
        let retired = std::mem::take(&mut self.retired);
        self.free.extend(retired.into_iter().map(|(r, _)| r));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_go_to_the_capture_region_while_capturing() {
        let mut r = Regions::new(2);
        assert_eq!(r.slot("GET_ROWS", Name::new("a")), 0);
        assert_eq!(r.slot("SET_ROWS", Name::new("b")), 1);
        let g = r.take_free().unwrap();
        assert_eq!(g, 1);
        r.capturing = Some((g, Vec::new()));
        assert_eq!(r.slot("SET_ROWS", Name::new("c")), REGION_WORDS);
        assert_eq!(r.slot("SET_ROWS", Name::new("d")), REGION_WORDS + 1);
        let (_, users) = r.capturing.take().unwrap();
        assert_eq!(users.len(), 2);
        assert_eq!(r.eager.len(), 2);
        // Past the region's words, the last one is shared.
        for _ in 0..REGION_WORDS + 5 {
            r.slot("GET_ROWS", Name::new("x"));
        }
        assert_eq!(r.slot("GET_ROWS", Name::new("y")), REGION_WORDS - 1);
        assert_eq!(r.eager.len(), REGION_WORDS);
        assert_eq!(r.take_free(), Some(2));
        assert_eq!(r.take_free(), None);
        r.retired.push((1, users));
        r.release_retired();
        assert_eq!(r.take_free(), Some(1));
    }

    #[test]
    fn the_first_word_set_names_the_error() {
        let users: Users = vec![("GET_ROWS", Name::new("a")), ("SET_ROWS", Name::new("b"))];
        assert_eq!(first_set(&[0, 0, 0], &users), None);
        let (op, node, shared) = first_set(&[0, 1, 1], &users).unwrap();
        assert_eq!((op, node.as_str(), shared), ("SET_ROWS", "b", false));
        // Words past the users are not read.
        assert_eq!(first_set(&[0, 0, 7], &users), None);
    }
}
