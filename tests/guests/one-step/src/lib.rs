//! The benchmark's durable run: one step whose output is the input, then that output
//! returned. Each run stores one step (a replay would skip it), the least a durable job
//! does beyond a no-op.

use wasq_guest::serde_json::value::RawValue;
use wasq_guest::{Error, step};

fn one_step(input: Box<RawValue>) -> Result<Box<RawValue>, Error> {
    step::run("echo", || Ok(input))
}

wasq_guest::task!(one_step);
