//! Loads `/bin/true` (or the program named on the command line, with the
//! rest of the line as its arguments) into an address space as Linux's
//! exec lays it out with ASLR off, and prints its maps, where it starts
//! and its initial stack pointer.
//!
//! `cargo run --release --example exec [-- /path/to/program args...]`

use aspace::exec::{load_elf, ExecArgs};
use aspace::{AddressSpace, Config};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.is_empty() {
        argv.push("/bin/true".into());
    }
    let envp = ["PATH=/usr/bin:/bin", "LANG=C"];
    let mm = AddressSpace::new(Config::default());
    let env: Vec<String> = envp.iter().map(|s| s.to_string()).collect();
    let img = load_elf(&mm, &ExecArgs::new(&argv[0], &argv, &env))?;
    print!("{}", mm.maps());
    println!(
        "entry {:#x} (program entry {:#x}, load bias {:#x})",
        img.entry, img.program_entry, img.load_bias
    );
    if let Some(base) = img.interp_base {
        println!("interpreter at {base:#x}");
    }
    println!("rsp {:#x}, heap from {:#x}", img.rsp, img.brk);
    let mut argc = [0u8; 8];
    mm.read(img.rsp, &mut argc)?;
    println!("argc {} (read at rsp)", u64::from_le_bytes(argc));
    Ok(())
}
