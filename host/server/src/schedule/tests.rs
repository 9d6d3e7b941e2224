//! The scheduler's bookkeeping on a made-up clock: which ticks come due after a pause, a
//! stall, a redeploy or a budget cut. (Enqueueing is tested against the real daemon in
//! tests/tests/cron.rs.)

use super::*;

const T0: &str = "2026-01-01T00:00:00.500Z";
const NONE: Vec<Millis> = Vec::new();

fn ms(rfc3339: &str) -> Millis {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .unwrap()
        .timestamp_millis()
}

/// Seconds after T0's whole second, as tick times.
fn secs(s: &[i64]) -> Vec<Millis> {
    s.iter().map(|s| ms(T0) - 500 + s * 1000).collect()
}

fn function(crons: &[&str], tz: &str, missed: Missed) -> Function {
    Function {
        tenant: "t".into(),
        name: "f".into(),
        digest: "d".into(),
        size_bytes: 1,
        settings: FunctionSettings::default(),
        events: vec![],
        schedule: Some(Schedule {
            crons: crons.iter().map(|c| c.to_string()).collect(),
            tz: tz.into(),
            missed,
            paused: false,
            resumed_at: None,
        }),
        created_at: 0,
        updated_at: 0,
    }
}

/// What the store lists of `f` (`Registry::schedules`): it, while it has a schedule.
fn listed(f: &Function) -> Vec<Scheduled> {
    f.scheduled().into_iter().collect()
}

/// A pass at `now` that enqueues nothing ahead.
fn at(now: Millis) -> Window {
    Window { now, horizon: now }
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// A pass at `now` in which every due tick is enqueued: the ticks, oldest first.
fn pass(state: &mut TenantState, f: &Function, now: Millis) -> Vec<Millis> {
    state.plan("t", listed(f), at(now), far());
    let mut fired = vec![];
    for t in state.functions.values_mut() {
        if t.schedule.paused {
            continue;
        }
        for c in &mut t.cursors {
            if c.missed_to.is_some() {
                continue;
            }
            while let Some(&tick) = c.due.front()
                && tick <= now
            {
                fired.push(tick);
                c.handled(tick);
            }
            c.settle(now);
        }
    }
    fired
}

fn pause(f: &mut Function, paused: bool, at: Millis) {
    let s = f.schedule.as_mut().unwrap();
    s.paused = paused;
    if !paused {
        s.resumed_at = Some(at);
    }
}

#[test]
fn resume_after_a_pause_follows_the_missed_policy() {
    for (missed, after_resume) in [(Missed::Skip, NONE), (Missed::Latest, secs(&[240]))] {
        let mut f = function(&["* * * * * *"], "UTC", missed);
        let mut st = TenantState::default();
        let t0 = ms(T0);
        let first = pass(&mut st, &f, t0);
        assert_eq!(
            first.len(),
            usize::from(missed == Missed::Latest),
            "{first:?}"
        );
        assert_eq!(pass(&mut st, &f, t0 + 1000), secs(&[1]));
        assert_eq!(pass(&mut st, &f, t0 + 2000), secs(&[2]));
        pause(&mut f, true, t0 + 2100);
        for s in 3..10 {
            assert_eq!(pass(&mut st, &f, t0 + s * 1000), NONE, "paused");
        }
        // Resumed four minutes later, seen by the next pass 300 ms on.
        pause(&mut f, false, t0 + 240_000);
        assert_eq!(
            pass(&mut st, &f, t0 + 240_300),
            after_resume,
            "{missed:?}: ticks of the pause"
        );
        assert_eq!(
            pass(&mut st, &f, t0 + 241_000),
            secs(&[241]),
            "then every tick"
        );
        assert_eq!(pass(&mut st, &f, t0 + 242_000), secs(&[242]));
    }
}

#[test]
fn a_pause_and_resume_between_two_passes_misses_its_ticks_too() {
    let mut f = function(&["* * * * * *"], "UTC", Missed::Skip);
    let mut st = TenantState::default();
    let t0 = ms(T0);
    pass(&mut st, &f, t0);
    assert_eq!(pass(&mut st, &f, t0 + 1000), secs(&[1]));
    // The scheduler never sees it paused: its next pass comes 30 s late.
    pause(&mut f, false, t0 + 30_000);
    assert_eq!(pass(&mut st, &f, t0 + 30_200), NONE);
    assert_eq!(pass(&mut st, &f, t0 + 31_000), secs(&[31]));
}

#[test]
fn a_short_stall_catches_up_and_a_long_one_follows_the_policy() {
    for (missed, first) in [(Missed::Skip, 542), (Missed::Latest, 541)] {
        let f = function(&["* * * * * *"], "UTC", missed);
        let mut st = TenantState::default();
        let t0 = ms(T0);
        pass(&mut st, &f, t0);
        assert_eq!(pass(&mut st, &f, t0 + 1000), secs(&[1]));
        // 30 s late (a slow store, say): every tick, oldest first.
        assert_eq!(
            pass(&mut st, &f, t0 + 31_000),
            secs(&(2..=31).collect::<Vec<_>>())
        );
        // Ten minutes late (an outage): ticks over a minute late are missed.
        assert_eq!(
            pass(&mut st, &f, t0 + 601_000),
            secs(&(first..=601).collect::<Vec<_>>()),
            "{missed:?}"
        );
        assert_eq!(pass(&mut st, &f, t0 + 602_000), secs(&[602]));
    }
}

#[test]
fn pending_ticks_wait_for_the_store_then_become_missed() {
    let f = function(&["* * * * * *"], "UTC", Missed::Skip);
    let mut st = TenantState::default();
    let t0 = ms(T0);
    pass(&mut st, &f, t0);
    // The store is down: passes find the ticks but cannot enqueue them.
    for s in 1..=5 {
        st.plan("t", listed(&f), at(t0 + s * 1000), far());
    }
    assert_eq!(pass(&mut st, &f, t0 + 6000), secs(&[1, 2, 3, 4, 5, 6]));
    for s in 7..=200 {
        st.plan("t", listed(&f), at(t0 + s * 1000), far());
    }
    assert_eq!(
        pass(&mut st, &f, t0 + 201_000),
        secs(&(142..=201).collect::<Vec<_>>()),
        "those over a minute late are missed"
    );
    assert_eq!(pass(&mut st, &f, t0 + 202_000), secs(&[202]));
}

#[test]
fn a_redeploy_keeps_the_progress_of_unchanged_expressions() {
    let mut f = function(&["* * * * * *"], "UTC", Missed::Skip);
    let mut st = TenantState::default();
    let t0 = ms(T0);
    pass(&mut st, &f, t0);
    assert_eq!(pass(&mut st, &f, t0 + 1000), secs(&[1]));
    f.schedule
        .as_mut()
        .unwrap()
        .crons
        .push("*/2 * * * * *".into());
    f.updated_at = t0 + 1500;
    // The old expression goes on at 2; the new one starts after it was first seen.
    assert_eq!(pass(&mut st, &f, t0 + 2000), secs(&[2]));
    assert_eq!(pass(&mut st, &f, t0 + 4000), secs(&[3, 4, 4]));
    // A function without a schedule is forgotten.
    f.schedule = None;
    assert_eq!(pass(&mut st, &f, t0 + 5000), NONE);
    assert!(st.functions.is_empty());
}

#[test]
fn a_search_budget_cut_goes_on_where_it_stopped() {
    let crons: Vec<String> = (0..10).map(|i| format!("{i} * * * * *")).collect();
    let crons: Vec<&str> = crons.iter().map(String::as_str).collect();
    let f = function(&crons, "UTC", Missed::Skip);
    let mut st = TenantState::default();
    let t0 = ms(T0);
    // No budget: nothing is searched, and nothing fires.
    st.plan("t", listed(&f), at(t0), Instant::now());
    let searched = |st: &TenantState| {
        st.functions["f"]
            .cursors
            .iter()
            .filter(|c| !c.due.is_empty())
            .count()
    };
    assert_eq!(searched(&st), 0);
    assert_eq!(pass(&mut st, &f, t0), NONE);
    st.plan("t", listed(&f), at(t0 + 1), far());
    assert_eq!(searched(&st), 10);
    assert_eq!(
        pass(&mut st, &f, t0 + 10_000),
        secs(&(1..=9).collect::<Vec<_>>())
    );
}

#[test]
fn first_sight_fires_the_latest_tick_only_when_asked() {
    let t0 = ms("2026-01-02T10:00:00Z");
    let f = function(&["0 9 * * *"], "UTC", Missed::Latest);
    let mut st = TenantState::default();
    assert_eq!(pass(&mut st, &f, t0), vec![ms("2026-01-02T09:00:00Z")]);
    assert_eq!(pass(&mut st, &f, t0 + 1000), NONE);
    let f = function(&["0 9 * * *"], "UTC", Missed::Skip);
    let mut st = TenantState::default();
    assert_eq!(pass(&mut st, &f, t0), NONE);
    assert_eq!(
        pass(&mut st, &f, ms("2026-01-03T09:00:00Z")),
        vec![ms("2026-01-03T09:00:00Z")]
    );
}

/// A pass that runs ahead of a second (`LEAD_MS` before it) enqueues that second's tick,
/// also of a schedule it sees for the first time; the next pass goes on from there.
#[test]
fn a_pass_ahead_of_its_second_takes_that_seconds_tick() {
    let f = function(&["* * * * * *"], "UTC", Missed::Skip);
    let mut st = TenantState::default();
    let second = ms(T0) + 500;
    let ahead = |second: Millis| Window {
        now: second - LEAD_MS,
        horizon: second,
    };
    st.plan("t", listed(&f), ahead(second), far());
    let due = |st: &TenantState| st.functions["f"].cursors[0].due.clone();
    assert_eq!(due(&st), [second], "first sight, {LEAD_MS} ms ahead");
    st.functions.get_mut("f").unwrap().cursors[0].handled(second);
    st.functions.get_mut("f").unwrap().cursors[0].settle(second);
    st.plan("t", listed(&f), ahead(second + 1000), far());
    assert_eq!(due(&st), [second + 1000]);
}
