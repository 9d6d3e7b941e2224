//! Named queues and worker pools (`celery worker -Q critical,default`, `rq worker high
//! default low`): a function's settings name the queue its runs wait in, and a worker
//! started with `--queues` takes runs only from the queues it names, in that order.
//!
//! The key decision: a queue is a routing filter, not a second scheduler. Within a queue
//! everything else holds as before (tenants take turns, rank orders, gates and quotas
//! hold back); a worker without `--queues` takes every queue as one. Strict order between
//! a worker's queues would let a busy first queue starve the last, so [`claim_order`]
//! puts a later queue first on every [`GUARD_EVERY`]th claim, in turn.

/// The queue of a function whose settings name none.
pub const DEFAULT_QUEUE: &str = "default";
/// Longest queue name.
pub const MAX_QUEUE_NAME: usize = 64;
/// Most queues one worker names.
pub const MAX_WORKER_QUEUES: usize = 16;
/// One claim in this many puts a later queue first (rotating through them), so a worker
/// whose first queue never empties still gives its other queues at least that share of
/// its claims.
pub const GUARD_EVERY: u64 = 8;

/// [`DEFAULT_QUEUE`], owned: the serde default of `FunctionSettings::queue`.
pub fn default_queue() -> String {
    DEFAULT_QUEUE.to_owned()
}

/// Queue names appear in keys, URLs and CLI tables: the rules of function names (1-64
/// ASCII letters, digits, `-`, `_` or `.`, starting with a letter or digit).
pub fn check_queue_name(name: &str) -> Result<(), String> {
    if crate::names::is_plain_name(name, MAX_QUEUE_NAME) {
        Ok(())
    } else {
        Err(format!(
            "invalid queue name {}: use 1-{MAX_QUEUE_NAME} letters, digits, '-', '_' or '.', \
             starting with a letter or digit",
            crate::names::quoted(name)
        ))
    }
}

/// A worker's `--queues` list (`critical,default,low`): names checked, order kept, at most
/// [`MAX_WORKER_QUEUES`], none twice.
pub fn parse_worker_queues(list: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for name in list.split(',').map(str::trim) {
        check_queue_name(name)?;
        if out.iter().any(|q| q == name) {
            return Err(format!(
                "queue {} is named twice",
                crate::names::quoted(name)
            ));
        }
        out.push(name.to_owned());
    }
    if out.len() > MAX_WORKER_QUEUES {
        return Err(format!(
            "{} queues named; a worker takes at most {MAX_WORKER_QUEUES}",
            out.len()
        ));
    }
    Ok(out)
}

/// The order claim number `claim` (counted by the worker from 0) takes `queues` in: as
/// listed, except that every [`GUARD_EVERY`]th claim starts with a later queue, each in
/// turn (the rest keep their order behind it). Empty stays empty (every queue).
pub fn claim_order(queues: &[String], claim: u64) -> Vec<String> {
    let mut order = queues.to_vec();
    if order.len() > 1 && claim % GUARD_EVERY == GUARD_EVERY - 1 {
        let round = claim / GUARD_EVERY;
        let first = 1 + (round % (order.len() as u64 - 1)) as usize;
        let q = order.remove(first);
        order.insert(0, q);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(s: &str) -> Vec<String> {
        s.split(',').map(str::to_owned).collect()
    }

    #[test]
    fn claims_follow_the_list_with_a_later_queue_first_in_turn() {
        let q = list("critical,default,low");
        let firsts: Vec<String> = (0..48).map(|c| claim_order(&q, c)[0].clone()).collect();
        // 7 of 8 claims start with the first queue; the 8th alternates the others.
        assert_eq!(firsts.iter().filter(|f| *f == "critical").count(), 42);
        assert_eq!(firsts.iter().filter(|f| *f == "default").count(), 3);
        assert_eq!(firsts.iter().filter(|f| *f == "low").count(), 3);
        assert_eq!(claim_order(&q, 7), list("default,critical,low"));
        assert_eq!(claim_order(&q, 15), list("low,critical,default"));
        assert_eq!(claim_order(&q, 0), q);
        assert_eq!(claim_order(&list("only"), 7), list("only"));
        assert!(claim_order(&[], 7).is_empty());
    }

    #[test]
    fn worker_queue_lists_are_checked() {
        assert_eq!(
            parse_worker_queues("critical, default").unwrap(),
            list("critical,default")
        );
        for bad in ["", "a,,b", "a,a", "a b", "x\u{1b}[0m"] {
            assert!(parse_worker_queues(bad).is_err(), "{bad:?}");
        }
        let many: Vec<String> = (0..17).map(|i| format!("q{i}")).collect();
        assert!(
            parse_worker_queues(&many.join(","))
                .unwrap_err()
                .contains("at most 16")
        );
    }
}
