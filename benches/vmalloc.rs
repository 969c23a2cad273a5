//! vmalloc benchmarks (being written).
fn main() {}
