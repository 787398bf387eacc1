//! The AFL++ harness: `fuzz TARGET`, built by `cargo afl build` and run by
//! `scripts/fuzz.sh`; each input goes to the target named on the command
//! line (the list is `iofloor_fuzz::TARGETS`).

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let Some(target) = iofloor_fuzz::target(&name) else {
        let names: Vec<&str> = iofloor_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
        eprintln!("usage: fuzz TARGET (one of {})", names.join(", "));
        std::process::exit(2);
    };
    afl::fuzz!(|data: &[u8]| {
        target(data);
    });
}
