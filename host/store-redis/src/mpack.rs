//! Reading what a script packed with `cmsgpack.pack` (Redis's Lua has it built in).
//!
//! Why: a claim answers every field of every claimed run, and redis-rs parses a reply
//! value by value through its parser combinators, allocating a `Value` for each: ~12% of a
//! worker's CPU in a drain. Packed, the reply is one bulk string, read here in one pass
//! over a slice; for Redis, packing costs about what converting the table to RESP did.
//!
//! Only what `cmsgpack.pack` writes for the tables the scripts pack: arrays, strings
//! (Lua strings are bytes: `str` formats, `bin` accepted too), non-negative integers (the
//! counts), and `false` or `nil` for a value that is absent.

use rmp::Marker;
use rmp::decode;
use wasq_core::StoreError;

use crate::decode::corrupt;

/// A cursor over packed bytes.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// `what` names the reply in errors.
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { rest: bytes, what }
    }

    fn bad(&self, why: impl std::fmt::Display) -> StoreError {
        corrupt(format!("{}: {why}", self.what))
    }

    fn peek(&self) -> Result<Marker, StoreError> {
        self.rest
            .first()
            .map(|b| Marker::from_u8(*b))
            .ok_or_else(|| self.bad("short"))
    }

    /// The length of the array that comes next.
    pub(crate) fn array(&mut self) -> Result<usize, StoreError> {
        match decode::read_array_len(&mut self.rest) {
            Ok(n) => Ok(n as usize),
            Err(e) => Err(self.bad(format!("not an array ({e:?})"))),
        }
    }

    /// The non-negative integer that comes next.
    pub(crate) fn count(&mut self) -> Result<usize, StoreError> {
        match decode::read_int::<u64, _>(&mut self.rest) {
            Ok(n) => usize::try_from(n).map_err(|_| self.bad("a count out of range")),
            Err(e) => Err(self.bad(format!("not a count ({e:?})"))),
        }
    }

    /// The string that comes next, or `None` for `false` / `nil`.
    pub(crate) fn opt_bytes(&mut self) -> Result<Option<&'a [u8]>, StoreError> {
        let len = match self.peek()? {
            Marker::False | Marker::Null => {
                self.rest = &self.rest[1..];
                return Ok(None);
            }
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                decode::read_str_len(&mut self.rest).map_err(|e| self.bad(format!("{e:?}")))?
            }
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
                decode::read_bin_len(&mut self.rest).map_err(|e| self.bad(format!("{e:?}")))?
            }
            other => return Err(self.bad(format!("{other:?} where a string belongs"))),
        };
        let len = len as usize;
        if self.rest.len() < len {
            return Err(self.bad("a string longer than the reply"));
        }
        let (s, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(Some(s))
    }

    /// The string that comes next.
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], StoreError> {
        self.opt_bytes()?
            .ok_or_else(|| self.bad("false where a string belongs"))
    }

    /// The UTF-8 string that comes next.
    pub(crate) fn string(&mut self) -> Result<String, StoreError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|e| self.bad(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes as Redis 7's `cmsgpack.pack` wrote them for
    /// `{ { false, 'a', string.rep('x', 300) }, 0, 2, 'e1', 'e2' }` and for `{}`.
    #[test]
    fn reads_what_cmsgpack_packs() {
        let mut packed = vec![0x95, 0x93, 0xc2, 0xa1, b'a', 0xda, 0x01, 0x2c];
        packed.extend(std::iter::repeat_n(b'x', 300));
        packed.extend([0x00, 0x02, 0xa2, b'e', b'1', 0xa2, b'e', b'2']);
        let mut r = Reader::new(&packed, "test");
        assert_eq!(r.array().unwrap(), 5);
        assert_eq!(r.array().unwrap(), 3);
        assert_eq!(r.opt_bytes().unwrap(), None);
        assert_eq!(r.bytes().unwrap(), b"a");
        assert_eq!(r.bytes().unwrap().len(), 300);
        assert_eq!(r.count().unwrap(), 0);
        assert_eq!(r.count().unwrap(), 2);
        assert_eq!(r.string().unwrap(), "e1");
        assert_eq!(r.string().unwrap(), "e2");
        assert!(r.opt_bytes().is_err(), "past the end");
        assert_eq!(Reader::new(&[0x90], "test").array().unwrap(), 0);
    }

    #[test]
    fn refuses_what_it_does_not_expect() {
        // A string that claims more bytes than there are.
        let err = Reader::new(&[0xa5, b'a'], "claim").bytes().unwrap_err();
        assert!(err.to_string().contains("claim"), "{err}");
        // A float where a count belongs, a count where a string belongs.
        assert!(
            Reader::new(&[0xcb, 0, 0, 0, 0, 0, 0, 0, 0], "t")
                .count()
                .is_err()
        );
        assert!(Reader::new(&[0x01], "t").bytes().is_err());
        assert!(Reader::new(&[0xc2], "t").bytes().is_err());
        assert!(Reader::new(&[], "t").array().is_err());
    }
}
