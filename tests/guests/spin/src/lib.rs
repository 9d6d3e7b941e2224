//! Attacks CPU limits: loops forever, so only the host's timeout (epoch deadline) or fuel
//! limit can stop it. Input is ignored.

use std::hint::black_box;
use wasq_guest::Error;

fn spin(_input: wasq_guest::serde_json::Value) -> Result<(), Error> {
    let mut x: u64 = 0;
    loop {
        x = black_box(x.wrapping_add(1));
    }
}

wasq_guest::task!(spin);
