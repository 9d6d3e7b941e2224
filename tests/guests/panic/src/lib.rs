//! Proves a guest panic is a failed attempt (a trap), not a host crash, and that its message
//! "guest panic: boom" reaches the host through stderr. Input is ignored.

use wasq_guest::Error;

fn panic(_input: wasq_guest::serde_json::Value) -> Result<(), Error> {
    panic!("guest panic: boom");
}

wasq_guest::task!(panic);
