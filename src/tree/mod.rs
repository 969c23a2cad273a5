//! RCU-readable B-tree of non-overlapping ranges (being written).
