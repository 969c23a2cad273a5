//! The reverse-map index's storage ([`super::RmapIndex`]): an ordered map
//! kept as a list of sorted chunks of up to [`CHUNK`] entries.
//!
//! Why not a `BTreeMap`: a family's VMAs are mostly filed in address
//! order, one by one, as their first writes come (a thread faulting
//! through a run of small mappings, upward as pft cuts them or downward as
//! `mmap` places them). A B-tree splits a full leaf in two on such an
//! append, so it allocates a node every five or six entries and leaves
//! them half full. Here an entry past the end of a full chunk (or before
//! the start of one) opens a new chunk sized for [`CHUNK`] entries, so
//! in-order filing allocates once per [`CHUNK`] entries and packs them;
//! only an insert into the middle of a full chunk splits it. A lookup is a
//! binary search over the chunks' last keys, then one inside the chunk;
//! the append and prepend cases check the ends first.
//!
//! Bounds: a new chunk is made only beside a full one, so there are at
//! most about twice as many chunks as full ones; a removal merges a chunk
//! with its neighbour when both together fit in half a chunk, so removals
//! cannot leave a long list of nearly empty chunks.
//!
//! # Locking
//!
//! None of its own: the family's lock ([`super::AnonRoot::lock`]) guards
//! the index that holds it.

/// Most entries in one chunk (40-byte entries: 2.5 KiB, so an insert into
/// the middle moves at most that much).
pub(crate) const CHUNK: usize = 64;

/// An ordered map of `K` to `V` in sorted chunks (see the module docs).
pub(crate) struct ChunkMap<K, V> {
    /// Each chunk non-empty and sorted; every key of a chunk below every
    /// key of the next.
    chunks: Vec<Vec<(K, V)>>,
    len: usize,
}

impl<K, V> Default for ChunkMap<K, V> {
    fn default() -> Self {
        ChunkMap {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<K: Ord + Copy, V> ChunkMap<K, V> {
    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Index of the chunk that holds `k`, or would hold it: the first
    /// whose last key is at least `k`, else the last chunk. `None` if
    /// there is no chunk.
    fn chunk_for(&self, k: &K) -> Option<usize> {
        let last = self.chunks.len().checked_sub(1)?;
        // The append case first: past the last chunk's first key.
        if self.chunks[last][0].0 <= *k {
            return Some(last);
        }
        let i = self
            .chunks
            .partition_point(|c| c.last().is_some_and(|(ck, _)| ck < k));
        Some(i.min(last))
    }

    /// Inserts `v` under `k`; returns the value it replaces, if any.
    pub(crate) fn insert(&mut self, k: K, v: V) -> Option<V> {
        let Some(i) = self.chunk_for(&k) else {
            self.chunks.push(vec![(k, v)]);
            self.len = 1;
            return None;
        };
        let c = &mut self.chunks[i];
        // The append case (in-order filing) needs no search: past the
        // chunk's last key, the entry goes at its end.
        let j = if c.last().is_some_and(|(ck, _)| *ck < k) {
            c.len()
        } else {
            match c.binary_search_by(|(ck, _)| ck.cmp(&k)) {
                Ok(j) => return Some(core::mem::replace(&mut c[j].1, v)),
                Err(j) => j,
            }
        };
        self.len += 1;
        if c.len() < CHUNK {
            c.insert(j, (k, v));
            return None;
        }
        // A full chunk. At either end, open a chunk beside it (in-order
        // filing packs chunks and allocates once per chunk); inside,
        // split it in two.
        let fresh = || Vec::with_capacity(CHUNK);
        if j == c.len() || j == 0 {
            let mut n = fresh();
            n.push((k, v));
            let at = if j == 0 { i } else { i + 1 };
            self.chunks.insert(at, n);
            return None;
        }
        let mut tail = fresh();
        tail.extend(c.drain(CHUNK / 2..));
        if j <= CHUNK / 2 {
            c.insert(j, (k, v));
        } else {
            tail.insert(j - CHUNK / 2, (k, v));
        }
        self.chunks.insert(i + 1, tail);
        None
    }

    /// The value under `k`.
    pub(crate) fn get(&self, k: &K) -> Option<&V> {
        let c = &self.chunks[self.chunk_for(k)?];
        let j = c.binary_search_by(|(ck, _)| ck.cmp(k)).ok()?;
        Some(&c[j].1)
    }

    /// Removes and returns the value under `k`.
    pub(crate) fn remove(&mut self, k: &K) -> Option<V> {
        let i = self.chunk_for(k)?;
        let c = &mut self.chunks[i];
        let j = c.binary_search_by(|(ck, _)| ck.cmp(k)).ok()?;
        let (_, v) = c.remove(j);
        self.len -= 1;
        if c.is_empty() {
            self.chunks.remove(i);
        } else {
            // Keep chunks at least a quarter full on average: merge with a
            // neighbour when both fit in half a chunk.
            if i + 1 < self.chunks.len() {
                self.merge_if_small(i);
            }
            if i > 0 && i < self.chunks.len() {
                self.merge_if_small(i - 1);
            }
        }
        Some(v)
    }

    /// Merges chunk `i + 1` into chunk `i` if both fit in half a chunk.
    fn merge_if_small(&mut self, i: usize) {
        if self.chunks[i].len() + self.chunks[i + 1].len() <= CHUNK / 2 {
            let next = self.chunks.remove(i + 1);
            self.chunks[i].extend(next);
        }
    }

    /// Every entry, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.chunks.iter().flatten().map(|(k, v)| (k, v))
    }

    /// The entries with keys at most `hi`, in key order.
    pub(crate) fn up_to<'a>(&'a self, hi: &'a K) -> impl Iterator<Item = (&'a K, &'a V)> {
        self.iter().take_while(move |(k, _)| *k <= hi)
    }

    /// Keeps only the entries for which `f` is true, in one pass
    /// (repacking the chunks).
    pub(crate) fn retain(&mut self, mut f: impl FnMut(&K, &V) -> bool) {
        let old = core::mem::take(self);
        *self = Self::from_sorted(old.into_sorted().filter(|(k, v)| f(k, v)));
    }

    /// Takes every entry out, in key order.
    pub(crate) fn into_sorted(self) -> impl Iterator<Item = (K, V)> {
        self.chunks.into_iter().flatten()
    }

    /// A map of entries given in strictly increasing key order, in full
    /// chunks.
    pub(crate) fn from_sorted(items: impl IntoIterator<Item = (K, V)>) -> Self {
        let mut m = ChunkMap::default();
        for (k, v) in items {
            debug_assert!(
                m.chunks
                    .last()
                    .and_then(|c: &Vec<(K, V)>| c.last())
                    .is_none_or(|(last, _)| *last < k),
                "from_sorted: keys out of order"
            );
            match m.chunks.last_mut() {
                Some(c) if c.len() < CHUNK => c.push((k, v)),
                _ => {
                    let mut n = Vec::with_capacity(CHUNK);
                    n.push((k, v));
                    m.chunks.push(n);
                }
            }
            m.len += 1;
        }
        m
    }

    /// Number of chunks (for tests of the packing).
    #[cfg(test)]
    fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Checks the invariants (for tests).
    #[cfg(test)]
    fn check(&self) {
        let mut prev: Option<K> = None;
        let mut n = 0;
        for c in &self.chunks {
            assert!(!c.is_empty() && c.len() <= CHUNK, "chunk of {}", c.len());
            for (k, _) in c {
                assert!(prev.is_none_or(|p| p < *k), "keys out of order");
                prev = Some(*k);
                n += 1;
            }
        }
        assert_eq!(n, self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Ascending and descending filing packs full chunks: one chunk per
    /// `CHUNK` entries, where splitting would leave them half full.
    #[test]
    fn in_order_filing_packs_chunks() {
        let n = 10 * CHUNK;
        let mut up = ChunkMap::default();
        for k in 0..n {
            assert!(up.insert(k, k).is_none());
        }
        up.check();
        assert_eq!(up.chunk_count(), 10);
        let mut down = ChunkMap::default();
        for k in (0..n).rev() {
            assert!(down.insert(k, k).is_none());
        }
        down.check();
        assert_eq!(down.chunk_count(), 10);
        assert!(up.iter().eq(down.iter()));
        assert_eq!(
            up.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            (0..n).collect::<Vec<_>>()
        );
        // The last key again is a replacement, not an append.
        assert_eq!(up.insert(n - 1, 0), Some(n - 1));
        up.check();
        assert_eq!(up.len(), n);
        assert_eq!(up.get(&(n - 1)), Some(&0));
    }

    /// Inserts into the middle of full chunks split them and keep order.
    #[test]
    fn middle_inserts_split_full_chunks() {
        let mut m = ChunkMap::default();
        for k in 0..CHUNK as u64 {
            m.insert(k * 2, k);
        }
        assert_eq!(m.chunk_count(), 1);
        m.insert(41, 1000);
        m.check();
        assert_eq!(m.chunk_count(), 2);
        assert_eq!(m.get(&41), Some(&1000));
        assert_eq!(m.insert(41, 7), Some(1000), "an equal key replaces");
        assert_eq!(m.len(), CHUNK + 1);
    }

    /// A pseudo-random mix of inserts, removals, lookups and range scans
    /// agrees with a `BTreeMap` throughout, and removals keep the chunks
    /// from thinning out.
    #[test]
    fn agrees_with_a_btreemap() {
        let mut m = ChunkMap::default();
        let mut model = BTreeMap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..20_000u64 {
            let k = next() % 2_000;
            match next() % 8 {
                0..=3 => assert_eq!(m.insert(k, round), model.insert(k, round)),
                4..=5 => assert_eq!(m.remove(&k), model.remove(&k)),
                6 => assert_eq!(m.get(&k), model.get(&k)),
                _ => assert!(m.up_to(&k).eq(model.range(..=k))),
            }
            if round % 997 == 0 {
                m.check();
                assert!(m.iter().eq(model.iter()));
            }
        }
        m.check();
        assert!(m.iter().eq(model.iter()));
        // Remove most entries: the chunks merge as they thin out.
        let keys: Vec<_> = model.keys().copied().collect();
        for k in keys.iter().filter(|k| *k % 16 != 0) {
            assert_eq!(m.remove(k), model.remove(k));
        }
        m.check();
        assert!(m.iter().eq(model.iter()));
        assert!(
            m.chunk_count() * CHUNK / 4 <= m.len() + CHUNK,
            "{} chunks for {} entries",
            m.chunk_count(),
            m.len()
        );
        m.retain(|k, _| k % 32 == 0);
        model.retain(|k, _| k % 32 == 0);
        m.check();
        assert!(m.iter().eq(model.iter()));
        for k in model.keys() {
            assert!(m.remove(k).is_some());
        }
        assert_eq!((m.len(), m.chunk_count()), (0, 0));
    }

    /// `from_sorted` builds full chunks that later inserts and removals
    /// treat like any others.
    #[test]
    fn from_sorted_then_edited() {
        let mut m = ChunkMap::from_sorted((0..300u64).map(|k| (k * 3, k)));
        m.check();
        assert_eq!(m.chunk_count(), 300usize.div_ceil(CHUNK));
        m.insert(1, 1);
        m.insert(900, 900);
        assert_eq!(m.remove(&3), Some(1));
        m.check();
        assert_eq!(m.len(), 301);
        assert_eq!(m.up_to(&6).map(|(k, _)| *k).collect::<Vec<_>>(), [0, 1, 6]);
    }
}
