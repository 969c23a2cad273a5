//! Deterministic semantics of every operation.
mod common;
use common::*;

#[test]
fn flag_values_are_linux() {
    assert_eq!(MAP_FIXED_NOREPLACE, libc::MAP_FIXED_NOREPLACE as u32);
}

#[test]
fn basic() {
    on_both(16, |t| {
        let r = t.region();
        assert_eq!(
            t.mmap(r.page(0), 4 * PAGE, RW, ANON | MAP_FIXED),
            Ok(r.page(0))
        );
        assert_eq!(
            t.mmap(r.page(4), 4 * PAGE, RW, ANON | MAP_FIXED),
            Ok(r.page(4))
        );
        assert_layout(t, &[(0, 8, "rw-p")]);
        eprintln!("{}", dump(t));
        t.write(r.page(1) + 5, b"hello").unwrap();
        assert_eq!(read_vec(t, r.page(1) + 5, 5).unwrap(), b"hello");
        eprintln!("{:?}", t.vm_flags());
    });
}
