//! Run ids: UUIDv7 minted from the store's clock, and the unique prefixes users may type
//! instead of a whole id.
//!
//! The key decision: a run id's first 48 bits are exactly its creation time by the store's
//! [`crate::Clock`] (not the system's), so a prefix names a time window and a backend
//! that indexes runs by creation time finds a prefix's candidates without scanning ids
//! ([`prefix_window`]). Backends that index ids themselves (SQLite) ignore the window.
//! The next 42 bits are a process-wide sequence, so ids minted in one millisecond sort in
//! the order they were minted (runs due at the same time start first come, first served).
//! Unlike uuid's own v7 context, the time is never moved forward to stay monotonic: a
//! clock that goes back (or a test's manual clock) still gives ids of that time.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::Millis;

/// A whole run id: `xxxxxxxx-xxxx-7xxx-xxxx-xxxxxxxxxxxx`.
pub const RUN_ID_LEN: usize = 36;

/// Candidates a prefix lookup returns at most: one is the run, more are listed in the
/// "ambiguous" answer.
pub const PREFIX_CANDIDATES: usize = 5;

/// A new run id created at `now`: its time, then the sequence, then 32 random bits.
pub fn new_run_id(now: Millis) -> String {
    let ms = u64::try_from(now).unwrap_or(0);
    let ts = uuid::Timestamp::from_unix(Sequence, ms / 1000, (ms % 1000) as u32 * 1_000_000);
    uuid::Uuid::new_v7(ts).to_string()
}

const SEQUENCE_BITS: usize = 42;

/// Starts at a random point (a restarted process does not repeat the last one's ids'
/// order), 2^41 ids short of wrapping.
static NEXT: LazyLock<AtomicU64> = LazyLock::new(|| {
    let random = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, 0, 0));
    let bits = u64::from_be_bytes(random.as_bytes()[8..16].try_into().unwrap());
    AtomicU64::new(bits >> (64 - (SEQUENCE_BITS - 1)))
});

/// The sequence as uuid's counter: uuid places it below the time, around the variant
/// bits, and fills the rest with random bits.
struct Sequence;

impl uuid::ClockSequence for Sequence {
    type Output = u64;

    fn generate_sequence(&self, _seconds: u64, _subsec_nanos: u32) -> u64 {
        NEXT.fetch_add(1, Ordering::Relaxed) & ((1 << SEQUENCE_BITS) - 1)
    }

    fn usable_bits(&self) -> usize {
        SEQUENCE_BITS
    }
}

/// What the user typed where a run id goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdRef {
    /// A whole id (or something that cannot be a prefix of one): looked up as is.
    Whole(String),
    /// A lowercase proper prefix of an id.
    Prefix(String),
}

/// Classifies `s`: a proper prefix of the id format (hex digits, `-` at the format's
/// places, any case) is a [`IdRef::Prefix`]; everything else is looked up whole.
pub fn parse_id_ref(s: &str) -> IdRef {
    let lower = s.to_ascii_lowercase();
    let fits = !lower.is_empty()
        && lower.len() < RUN_ID_LEN
        && lower.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
    if fits {
        IdRef::Prefix(lower)
    } else {
        IdRef::Whole(s.to_owned())
    }
}

/// The creation times (inclusive, ms) of the runs whose id starts with `prefix` (a
/// [`IdRef::Prefix`]): its first 12 hex digits are the time, high digits first.
pub fn prefix_window(prefix: &str) -> (Millis, Millis) {
    let digits: String = prefix.chars().filter(|c| *c != '-').take(12).collect();
    let shift = 4 * (12 - digits.len() as u32);
    let value = u64::from_str_radix(&digits, 16).unwrap_or(0);
    let lo = value << shift;
    let hi = lo | ((1u64 << shift) - 1);
    (lo as Millis, hi as Millis)
}

/// Whether `s` has a whole run id's form (any case; any version digit).
pub fn is_run_id(s: &str) -> bool {
    s.len() == RUN_ID_LEN
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// A string that sorts after the id of every run created before `at` and before the id of
/// every run created at `at` or later (its version digit is 0, an id's is 7): a
/// [`crate::RunQuery::before`] bound for "created before `at`".
pub fn time_floor(at: Millis) -> String {
    let ms = u64::try_from(at).unwrap_or(0) & ((1 << 48) - 1);
    format!(
        "{:08x}-{:04x}-0000-0000-000000000000",
        ms >> 16,
        ms & 0xffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_starts_with_its_creation_time_and_its_prefixes_find_it() {
        for now in [0, 1, 1_764_590_400_123, 281_474_976_710_655] {
            let id = new_run_id(now);
            assert_eq!(id.len(), RUN_ID_LEN);
            assert_eq!(parse_id_ref(&id), IdRef::Whole(id.clone()));
            for n in 1..RUN_ID_LEN {
                let IdRef::Prefix(p) = parse_id_ref(&id[..n].to_uppercase()) else {
                    panic!("{} is a prefix", &id[..n]);
                };
                assert_eq!(p, id[..n]);
                let (lo, hi) = prefix_window(&p);
                assert!(lo <= now && now <= hi, "{p}: {lo}..{hi} misses {now}");
                if n >= 13 {
                    assert_eq!((lo, hi), (now, now));
                }
            }
        }
    }

    #[test]
    fn ids_of_one_millisecond_sort_in_minting_order_and_keep_their_time() {
        let ids: Vec<String> = (0..1000).map(|_| new_run_id(5_000)).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, ids, "distinct, in minting order");
        // A clock that went back: the id has the time it was given.
        let earlier = new_run_id(4_000);
        assert_eq!(prefix_window(&earlier[..13]), (4_000, 4_000));
        assert!(earlier < ids[0]);
        assert!(ids.iter().all(|id| id.as_bytes()[14] == b'7'), "version 7");
    }

    #[test]
    fn a_time_floor_parts_the_ids_before_and_after_it() {
        for at in [1, 1_764_590_400_123, 281_474_976_710_655] {
            let floor = time_floor(at);
            assert_eq!(floor.len(), RUN_ID_LEN);
            assert!(new_run_id(at - 1) < floor, "{at}");
            assert!(floor < new_run_id(at), "{at}");
        }
    }

    #[test]
    fn what_cannot_start_an_id_is_looked_up_whole() {
        for s in [
            "",
            "x",
            "0198-",
            "01981234_",
            "../../etc",
            "01981234-abcd-7abc-9abc-0123456789ab0",
        ] {
            assert_eq!(parse_id_ref(s), IdRef::Whole(s.to_owned()), "{s:?}");
        }
        assert_eq!(parse_id_ref("01981234-"), IdRef::Prefix("01981234-".into()));
        assert_eq!(prefix_window("0"), (0, (1 << 44) - 1));
    }
}
