//! maps(): the lines have /proc/self/maps's format and content.

use super::*;

#[test]
fn maps_lines_have_the_proc_format() {
    let k = KernelTarget::new(32);
    let region = k
        .as_ref()
        .map_or(Region::new(aspace_target_start(), 32), |k| k.region());
    let mut a = AspaceTarget::new(region);
    let setup = |t: &mut dyn Target| {
        let r = t.region();
        map(t, 0, 2, RW, ANON);
        map(t, 2, 1, PROT_READ | PROT_EXEC, ANON);
        map(t, 4, 3, RW, SHARED_ANON);
        map(t, 8, 1, PROT_NONE, ANON);
        check!(t, t.mprotect(r.page(5), PAGE, PROT_READ), Ok(()));
    };
    setup(&mut a);
    let mine: Vec<String> =
        a.mm.maps()
            .lines()
            .map(str::to_string)
            .filter(|l| parse_line_start(l).is_some_and(|s| s >= region.start && s < region.end))
            .collect();
    // Exact text for private anonymous memory (note the trailing space).
    let p0 = region.page(0);
    assert!(
        mine.contains(&format!(
            "{:08x}-{:08x} rw-p 00000000 00:00 0 ",
            p0,
            p0 + 2 * PAGE
        )),
        "{mine:#?}"
    );
    assert!(mine.contains(&format!(
        "{:08x}-{:08x} r-xp 00000000 00:00 0 ",
        p0 + 2 * PAGE,
        p0 + 3 * PAGE
    )));
    assert!(mine.contains(&format!(
        "{:08x}-{:08x} ---p 00000000 00:00 0 ",
        p0 + 8 * PAGE,
        p0 + 9 * PAGE
    )));
    // Shared anonymous memory: a deleted /dev/zero object, its page offset,
    // the path in column 74.
    let sh: Vec<&String> = mine
        .iter()
        .filter(|l| l.contains(" rw-s ") || l.contains(" r--s "))
        .collect();
    assert!(
        sh.iter()
            .all(|l| l.ends_with(" /dev/zero (deleted)") && l.find('/') == Some(73)),
        "{sh:#?}"
    );
    assert!(sh.iter().any(|l| l.contains(&format!(
        "{:08x}-{:08x} r--s 00001000 00:01 ",
        p0 + 5 * PAGE,
        p0 + 6 * PAGE
    ))));
    // Against the kernel's own lines, inode numbers masked.
    if let Some(mut k) = k {
        setup(&mut k);
        let mask = |l: &String| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let inode = if f[4] == "0" { "0" } else { "INO" };
            let head = format!("{} {} {} {} {}", f[0], f[1], f[2], f[3], inode);
            (head, f[5..].join(" "), l.ends_with(' '), l.find('/'))
        };
        let theirs: Vec<_> = k.maps_lines().iter().map(mask).collect();
        let ours: Vec<_> = mine.iter().map(mask).collect();
        // The path column position depends on the inode's width: compare
        // it only where the widths agree.
        let strip = |v: &Vec<(String, String, bool, Option<usize>)>| {
            v.iter()
                .map(|(h, p, s, _)| (h.clone(), p.clone(), *s))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            strip(&ours),
            strip(&theirs),
            "maps() against /proc/self/maps"
        );
    }
}

fn parse_line_start(l: &str) -> Option<u64> {
    u64::from_str_radix(l.split('-').next()?, 16).ok()
}
