//! A model of a GPU's L2 cache, to count the DRAM traffic of a sequence of launches: an
//! LRU over 32-byte sectors with write-back and write-allocate.
//!
//! Each launch's distinct sectors are applied in address order (reads before the write
//! of the same sector), not in the order the interpreter's host threads touched them,
//! so the counts do not depend on the host. A read of a sector that is not resident is
//! one DRAM sector read; the first write that makes a sector dirty is one DRAM sector
//! write (its eventual write-back), further writes while it stays resident are free. The
//! model persists across launches until [`L2Model::reset`], so a pass's first touches
//! are DRAM traffic and re-reads of resident data are not.

use std::collections::{HashMap, VecDeque};

use super::access::SECTOR_BYTES;

/// A sector was read by the launch.
pub const READ: u8 = 1;
/// A sector was written by the launch.
pub const WRITE: u8 = 2;

/// DRAM sectors a launch moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DramTraffic {
    /// Sectors read from DRAM (L2 misses).
    pub read_sectors: u64,
    /// Sectors the launch made dirty (each written back to DRAM once).
    pub write_sectors: u64,
}

impl DramTraffic {
    /// Bytes moved in both directions.
    pub fn bytes(&self) -> u64 {
        (self.read_sectors + self.write_sectors) * SECTOR_BYTES
    }
}

struct Entry {
    stamp: u64,
    dirty: bool,
}

/// The L2 model (see the module docs).
pub struct L2Model {
    capacity: usize,
    map: HashMap<u64, Entry>,
    /// `(sector, stamp)` in use order; entries whose stamp is no longer the sector's are
    /// stale and skipped.
    order: VecDeque<(u64, u64)>,
    clock: u64,
}

impl L2Model {
    /// An empty L2 of `bytes` (at least one sector).
    pub fn new(bytes: u64) -> L2Model {
        L2Model {
            capacity: (bytes / SECTOR_BYTES).max(1) as usize,
            map: HashMap::new(),
            order: VecDeque::new(),
            clock: 0,
        }
    }

    /// Its size in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity as u64 * SECTOR_BYTES
    }

    /// Bytes resident now.
    pub fn resident_bytes(&self) -> u64 {
        self.map.len() as u64 * SECTOR_BYTES
    }

    /// Empties it (the start of a pass).
    pub fn reset(&mut self) {
        self.map.clear();
        self.order.clear();
        self.clock = 0;
    }

    /// Applies one launch's distinct sectors, `(sector index, READ | WRITE flags)`,
    /// sorted by sector; returns the DRAM traffic they cause.
    pub fn apply(&mut self, sectors: &[(u64, u8)]) -> DramTraffic {
        let mut t = DramTraffic::default();
        for &(s, flags) in sectors {
            if flags & READ != 0 && !self.touch(s, false) {
                t.read_sectors += 1;
            }
            if flags & WRITE != 0 && !self.touch(s, true) {
                t.write_sectors += 1;
            }
        }
        t
    }

    /// Uses sector `s`; `write` makes it dirty. Returns whether it was resident (for a
    /// write: resident and already dirty), i.e. whether no DRAM traffic is due.
    fn touch(&mut self, s: u64, write: bool) -> bool {
        self.clock += 1;
        let stamp = self.clock;
        let hit = match self.map.get_mut(&s) {
            Some(e) => {
                let hit = !write || e.dirty;
                e.stamp = stamp;
                e.dirty |= write;
                hit
            }
            None => {
                self.map.insert(
                    s,
                    Entry {
                        stamp,
                        dirty: write,
                    },
                );
                false
            }
        };
        self.order.push_back((s, stamp));
        while self.map.len() > self.capacity {
            let (old, st) = self.order.pop_front().expect("a resident sector is queued");
            if self.map.get(&old).is_some_and(|e| e.stamp == st) {
                self.map.remove(&old);
            }
        }
        if self.order.len() > 2 * self.capacity + 1024 {
            self.compact();
        }
        hit
    }

    /// Drops the stale queue entries.
    fn compact(&mut self) {
        let map = &self.map;
        self.order
            .retain(|(s, st)| map.get(s).is_some_and(|e| e.stamp == *st));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(range: std::ops::Range<u64>) -> Vec<(u64, u8)> {
        range.map(|s| (s, READ)).collect()
    }

    #[test]
    fn second_read_hits_until_reset() {
        let mut l2 = L2Model::new(1 << 20);
        assert_eq!(l2.apply(&reads(0..100)).read_sectors, 100);
        assert_eq!(l2.apply(&reads(0..100)).read_sectors, 0);
        l2.reset();
        assert_eq!(l2.apply(&reads(0..100)).read_sectors, 100);
    }

    #[test]
    fn a_footprint_larger_than_the_cache_misses_again() {
        // 64 sectors of capacity, 100 read in order: LRU keeps the last 64, and a second
        // pass in the same order evicts each before it is reused.
        let mut l2 = L2Model::new(64 * SECTOR_BYTES);
        assert_eq!(l2.apply(&reads(0..100)).read_sectors, 100);
        assert_eq!(l2.apply(&reads(0..100)).read_sectors, 100);
        assert_eq!(l2.resident_bytes(), 64 * SECTOR_BYTES);
        // The last 64 are resident.
        assert_eq!(l2.apply(&reads(36..100)).read_sectors, 0);
    }

    #[test]
    fn writes_count_once_while_dirty() {
        let mut l2 = L2Model::new(1 << 20);
        let w: Vec<(u64, u8)> = (0..10).map(|s| (s, WRITE)).collect();
        assert_eq!(
            l2.apply(&w),
            DramTraffic {
                read_sectors: 0,
                write_sectors: 10
            }
        );
        assert_eq!(l2.apply(&w).write_sectors, 0);
        // Reading what was written hits.
        assert_eq!(l2.apply(&reads(0..10)).read_sectors, 0);
        // Read and write of the same sector in one launch: a miss and a write-back.
        let rw = [(50, READ | WRITE)];
        assert_eq!(
            l2.apply(&rw),
            DramTraffic {
                read_sectors: 1,
                write_sectors: 1
            }
        );
    }
}
