//! The structural invariant check, for tests and debugging.
//!
//! # Locking
//!
//! None: it reads the tree under its own pin, like every read (see the lock
//! order in [`crate::mm`]); run concurrently with a writer it checks one
//! published version.

use super::node::{Node, B, MIN};
use super::RangeTree;

impl<V: Clone + Send + Sync + 'static> RangeTree<V> {
    /// Checks every structural invariant: entries sorted and disjoint and
    /// non-empty, summaries exact, node fill between the minimum and `B`
    /// (the root excepted), all leaves at one depth, `len` exact.
    pub fn check_invariants(&self) -> Result<(), String> {
        let g = self.pin();
        let Some(root) = self.root(&g) else {
            return if self.is_empty() {
                Ok(())
            } else {
                Err(format!("empty root but len {}", self.len()))
            };
        };
        let mut walk = Walk {
            leaf_depth: None,
            count: 0,
            last_end: 0,
        };
        walk.check(root, true, 1)?;
        if walk.count != self.len() {
            return Err(format!("len {} but {} entries", self.len(), walk.count));
        }
        Ok(())
    }
}

/// What the check has seen so far, in key order.
struct Walk {
    /// The depth of the leaves (all must share it).
    /// Protected by: owned by the check.
    leaf_depth: Option<usize>,
    /// Entries seen.
    /// Protected by: owned by the check.
    count: usize,
    /// The end of the last entry seen.
    /// Protected by: owned by the check.
    last_end: u64,
}

impl Walk {
    fn check<V>(&mut self, n: &Node<V>, is_root: bool, depth: usize) -> Result<(), String> {
        let len = n.len();
        if len == 0 || len > B || (!is_root && len < MIN) {
            return Err(format!("node fill {len} at depth {depth}"));
        }
        match n {
            Node::Leaf(l) => {
                match self.leaf_depth {
                    Some(d) if d != depth => {
                        return Err(format!("leaves at depths {d} and {depth}"))
                    }
                    _ => self.leaf_depth = Some(depth),
                }
                for i in 0..l.len {
                    if l.starts[i] >= l.ends[i] {
                        return Err(format!("empty entry {:?}", l.entry(i)));
                    }
                    if self.count > 0 && l.starts[i] < self.last_end {
                        return Err(format!(
                            "entry {:?} overlaps or is out of order",
                            l.entry(i)
                        ));
                    }
                    if l.vals[i].is_none() {
                        return Err("slot without a value".into());
                    }
                    self.last_end = l.ends[i];
                    self.count += 1;
                }
            }
            Node::Internal(x) => {
                for k in 0..x.len {
                    let c = x.child(k);
                    let (s, want) = (c.summary(), x.kid_summary(k));
                    if s != want {
                        return Err(format!("stale summary {want:?}, subtree has {s:?}"));
                    }
                    self.check(c, false, depth + 1)?;
                }
            }
        }
        Ok(())
    }
}
