//! Attacks the memory limit: input `{"mib": N}` allocates and touches N MiB with `vec!`, so a
//! limit below N MiB must refuse the growth (the guest then aborts with "memory allocation
//! of ... failed" on stderr). Output: the number of bytes allocated.

use std::hint::black_box;
use wasq_guest::Error;
use wasq_guest::serde::Deserialize;

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    mib: usize,
}

fn alloc(input: Input) -> Result<usize, Error> {
    let bytes = input.mib.checked_mul(1 << 20).ok_or_else(|| {
        Error::fatal(format!(
            "{} MiB does not fit in a 32-bit address space",
            input.mib
        ))
    })?;
    // `vec![1u8; n]` writes every byte, so the pages are really touched.
    let v = black_box(vec![1u8; bytes]);
    Ok(v.len())
}

wasq_guest::task!(alloc);
