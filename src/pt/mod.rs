//! Simulated 4-level page table (being written).
