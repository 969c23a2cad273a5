//! Range-tree benchmarks (being written).
fn main() {}
