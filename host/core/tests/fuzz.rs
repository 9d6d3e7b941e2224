//! Property tests of the core's parsers of untrusted text: key expressions (a deployer's
//! `*_key` settings, evaluated against any run input) and `wait-for-event` filters (a
//! guest's text, matched against any event's data).
//!
//! Case counts are per target (cheap string parsers get thousands); `PROPTEST_CASES=N`
//! overrides them all for a longer run.

use proptest::prelude::*;
use serde_json::{Map, Value};
use wasq_core::flow::{ConcurrencyLimit, Debounce, FlowControl, KeyExpr, MAX_KEY_BYTES, RateLimit};
use wasq_core::{check_event_filter, event_matches};

fn cases(default: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        // Failures are saved beside this file (fuzz.proptest-regressions) and replayed.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = default;
    }
    config
}

/// Object field names: short ones collide with filter paths and key segments; the rest
/// are any text (dots, quotes, escapes, non-ASCII).
fn field_name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-c_]{1,2}", ".{0,8}"]
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        prop_oneof!["[a-c]{0,3}", ".{0,12}", Just("null".to_string())].prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((field_name(), inner), 0..5)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// JSON text with every object's fields written in reverse order.
fn reversed_text(v: &Value) -> String {
    match v {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(reversed_text).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(fields) => {
            let fields: Vec<String> = fields
                .iter()
                .rev()
                .map(|(k, v)| format!("{}:{}", Value::from(k.as_str()), reversed_text(v)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        other => other.to_string(),
    }
}

/// The key the docs promise for a found value.
fn expected_key(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[derive(Debug, Clone)]
enum Seg {
    Dot(String),
    /// A field as a JSON string literal; `true`: every character as a `\u` escape.
    Quoted(String, bool),
    Index(usize),
}

fn segment() -> impl Strategy<Value = Seg> {
    prop_oneof![
        "[A-Za-z_][A-Za-z0-9_-]{0,8}".prop_map(Seg::Dot),
        (".{0,10}", any::<bool>()).prop_map(|(s, u)| Seg::Quoted(s, u)),
        (0usize..4).prop_map(Seg::Index),
    ]
}

fn render(segs: &[Seg]) -> String {
    let mut out = String::from("input");
    for s in segs {
        match s {
            Seg::Dot(n) => out += &format!(".{n}"),
            Seg::Quoted(n, false) => out += &format!("[{}]", Value::from(n.as_str())),
            Seg::Quoted(n, true) => {
                let mut units = [0u16; 2];
                let escaped: String = n
                    .chars()
                    .flat_map(|c| c.encode_utf16(&mut units).to_vec())
                    .map(|u| format!("\\u{u:04x}"))
                    .collect();
                out += &format!("[\"{escaped}\"]");
            }
            Seg::Index(i) => out += &format!("[{i}]"),
        }
    }
    out
}

/// An input holding `leaf` at `segs`, with `noise` beside it at every level.
fn input_with(segs: &[Seg], leaf: Value, noise: &Value) -> Value {
    segs.iter().rev().fold(leaf, |inner, seg| match seg {
        Seg::Dot(name) | Seg::Quoted(name, _) => {
            let mut m = Map::new();
            m.insert("~noise".into(), noise.clone());
            m.insert(name.clone(), inner);
            Value::Object(m)
        }
        Seg::Index(i) => {
            let mut items = vec![noise.clone(); *i];
            items.push(inner);
            items.push(noise.clone());
            Value::Array(items)
        }
    })
}

fn keyed_flow(expr: &KeyExpr) -> FlowControl {
    FlowControl {
        concurrency: Some(ConcurrencyLimit {
            limit: 1,
            key: Some(expr.clone()),
        }),
        throttle: Some(RateLimit {
            limit: 1,
            period_ms: 1000,
            key: Some(expr.clone()),
        }),
        rate_limit: Some(RateLimit {
            limit: 1,
            period_ms: 1000,
            key: Some(expr.clone()),
        }),
        debounce: Some(Debounce {
            period_ms: 1000,
            key: Some(expr.clone()),
        }),
        ..FlowControl::default()
    }
}

/// Text close to key expressions: their own characters, mostly.
fn expr_like() -> impl Strategy<Value = String> {
    prop_oneof![
        r#"input[\.\[\]"\\a-z0-9_\- u]{0,30}"#,
        r#"[\.\[\]"\\a-z0-9_\- ]{0,20}"#,
        ".{0,40}",
        Just("input".to_string()),
    ]
}

proptest! {
    #![proptest_config(cases(4000))]

    /// Any text: a clear error or an expression that prints and serialises back to itself.
    #[test]
    fn key_expressions_never_panic_and_round_trip(text in expr_like()) {
        match KeyExpr::parse(&text) {
            Ok(k) => {
                prop_assert_eq!(k.as_str(), text.as_str());
                prop_assert!(text.len() <= 256);
                prop_assert_eq!(KeyExpr::parse(&k.to_string()), Ok(k.clone()));
                let json = serde_json::to_string(&k).unwrap();
                prop_assert_eq!(serde_json::from_str::<KeyExpr>(&json).unwrap(), k);
            }
            Err(e) => {
                prop_assert!(e.starts_with("invalid key expression"), "{}", e);
                prop_assert!(serde_json::from_str::<KeyExpr>(&Value::from(text.clone()).to_string()).is_err());
            }
        }
    }

    /// A path built from the grammar parses (within 256 characters and 16 segments) and
    /// finds the value put there, as the documented key.
    #[test]
    fn key_expressions_find_the_value_at_their_path(
        segs in prop::collection::vec(segment(), 0..20),
        leaf in json(),
        noise in json(),
    ) {
        let text = render(&segs);
        match KeyExpr::parse(&text) {
            Ok(k) => {
                prop_assert!(segs.len() <= 16 && text.len() <= 256, "{text} accepted");
                let input = input_with(&segs, leaf.clone(), &noise);
                prop_assert_eq!(k.eval(&input), expected_key(&leaf));
            }
            Err(e) => prop_assert!(
                (segs.len() > 16 && e.contains("segments")) || (text.len() > 256 && e.contains("longer")),
                "{} refused: {}", text, e
            ),
        }
    }

    /// One character inserted, removed or replaced in a valid expression: no panic, and
    /// whatever parses still round-trips.
    #[test]
    fn mutated_key_expressions_never_panic(
        segs in prop::collection::vec(segment(), 0..6),
        at in any::<prop::sample::Index>(),
        c in r#"[\.\[\]"\\0-9a-z_ \u{0}-\u{1f}é]"#,
        how in 0..3u8,
    ) {
        let mut chars: Vec<char> = render(&segs).chars().collect();
        let i = at.index(chars.len() + 1);
        let c = c.chars().next().unwrap();
        match how {
            0 => chars.insert(i, c),
            1 if i < chars.len() => { chars.remove(i); }
            _ if i < chars.len() => chars[i] = c,
            _ => chars.push(c),
        }
        let text: String = chars.into_iter().collect();
        if let Ok(k) = KeyExpr::parse(&text) {
            prop_assert_eq!(KeyExpr::parse(k.as_str()), Ok(k.clone()));
        }
    }
}

proptest! {
    #![proptest_config(cases(1500))]

    /// Evaluating against any input (JSON or not) gives gates named by bounded keys, the
    /// same keys shown on the run, whatever the order of the input's fields.
    #[test]
    fn plans_bound_their_keys_and_ignore_field_order(
        segs in prop::collection::vec(segment(), 0..4),
        input in json(),
        big in prop::option::of(".{150,400}"),
        junk in prop::collection::vec(any::<u8>(), 0..40),
        not_json in any::<bool>(),
    ) {
        let k = KeyExpr::parse(&render(&segs)).unwrap();
        let flow = keyed_flow(&k);
        // Sometimes the value found is a long string, to cross the bound.
        let input = match big {
            Some(text) => input_with(&segs, Value::from(text), &input),
            None => input,
        };
        let bytes = if not_json { junk } else { input.to_string().into_bytes() };
        let plan = flow.plan("fn-1", &bytes, None);
        let parsed: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let raw = k.eval(&parsed);
        let shown = [
            (&plan.concurrency, &plan.keys.concurrency, "c"),
            (&plan.throttle, &plan.keys.throttle, "t"),
            (&plan.rate_limit, &plan.keys.rate_limit, "r"),
            (&plan.debounce, &plan.keys.debounce, "d"),
        ];
        for (gate, key, kind) in shown {
            let key = key.as_deref().unwrap();
            prop_assert!(key.len() <= MAX_KEY_BYTES, "{} bytes", key.len());
            prop_assert_eq!(&gate.as_ref().unwrap().id, &format!("{kind}:fn-1:{key}"));
            if raw.len() <= MAX_KEY_BYTES {
                prop_assert_eq!(key, raw.as_str());
            } else {
                prop_assert!(key.len() == 17 && key.starts_with('#'), "{}", key);
                prop_assert!(key[1..].bytes().all(|b| b.is_ascii_hexdigit()));
            }
        }
        // Debug-escaped in the message: at most 6 bytes (`\u{1f}`) per byte of key.
        prop_assert!(wasq_core::lifecycle::rate_limited_error(&plan).message.len() <= 100 + 6 * MAX_KEY_BYTES);
        if !not_json {
            let reordered = flow.plan("fn-1", reversed_text(&input).as_bytes(), None);
            prop_assert_eq!(reordered.keys, plan.keys);
        }
    }

    /// Any filter text: `check_event_filter` accepts exactly the JSON objects, and a
    /// filter it refuses matches nothing. A match means every path holds its value.
    #[test]
    fn event_filters_match_only_what_they_say(
        filter in prop_oneof![
            json().prop_map(|v| v.to_string()),
            r#"[{}\[\]":,.a-c0-9 ]{0,30}"#,
            ".{0,30}",
        ],
        data in json(),
    ) {
        let object = matches!(serde_json::from_str::<Value>(&filter), Ok(Value::Object(_)));
        prop_assert_eq!(check_event_filter(&filter).is_ok(), object);
        if let Err(e) = check_event_filter(&filter) {
            prop_assert!(e.contains("invalid wait-for-event filter"));
        }
        let matched = event_matches(Some(&filter), &data);
        if !object {
            prop_assert!(!matched);
        }
        if matched {
            let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(&filter) else {
                unreachable!("checked above");
            };
            for (path, want) in &fields {
                let mut found = Some(&data);
                for key in path.split('.') {
                    found = found.and_then(|v| v.as_object()).and_then(|o| o.get(key));
                }
                prop_assert_eq!(found, Some(want), "path {}", path);
            }
        }
        prop_assert!(event_matches(None, &data));
    }

    /// A filter made of paths that exist in the data, with their values, matches; change
    /// one value and it does not.
    #[test]
    fn event_filters_match_paths_taken_from_the_data(
        data in prop::collection::vec((field_name(), json()), 1..5)
            .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 1..4),
        change in any::<Option<prop::sample::Index>>(),
    ) {
        // Every dotted path of the data whose names hold no '.', with its value.
        let mut paths: Vec<(String, Value)> = Vec::new();
        let mut stack: Vec<(Option<String>, &Value)> = vec![(None, &data)];
        while let Some((prefix, v)) = stack.pop() {
            if let Value::Object(fields) = v {
                for (k, child) in fields.iter().filter(|(k, _)| !k.contains('.')) {
                    let path = match &prefix {
                        None => k.clone(),
                        Some(p) => format!("{p}.{k}"),
                    };
                    paths.push((path.clone(), child.clone()));
                    stack.push((Some(path), child));
                }
            }
        }
        // Only when every top-level name holds a '.'.
        prop_assume!(!paths.is_empty());
        let mut filter = Map::new();
        for p in &picks {
            let (path, v) = &paths[p.index(paths.len())];
            filter.insert(path.clone(), v.clone());
        }
        prop_assert!(event_matches(Some(&Value::Object(filter.clone()).to_string()), &data));
        if let Some(c) = change {
            let path = filter.keys().nth(c.index(filter.len())).unwrap().clone();
            let other = Value::from(vec![filter[&path].clone()]);
            filter.insert(path, other);
            prop_assert!(!event_matches(Some(&Value::Object(filter).to_string()), &data));
        }
    }
}
