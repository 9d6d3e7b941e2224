//! The plain round trip used by many tests: returns its JSON input byte for byte (through
//! `RawValue`, so key order and number formatting survive; surrounding whitespace does not,
//! no input gives `null`, and input that is not JSON is a fatal "invalid input" error).

use wasq_guest::Error;
use wasq_guest::serde_json::value::RawValue;

fn echo(input: Box<RawValue>) -> Result<Box<RawValue>, Error> {
    Ok(input)
}

wasq_guest::task!(echo);
