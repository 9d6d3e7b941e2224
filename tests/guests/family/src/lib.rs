//! Child runs, one component in three roles, chosen by the input:
//! - `{"value": n}`: a child; returns n * n and logs "child n".
//! - `{"fan_out": N, "child": "square"}`: invokes N children (values 1..=N), joins them
//!   all, returns `{"sum": Σ n²}`.
//! - `{"call": "square", "value": n}`: calls one child and returns its output.
//! - `{"send": "event.name", "data": {...}}`: sends an event and returns `{"sent": true}`.

use wasq_guest::serde::Deserialize;
use wasq_guest::serde_json::{Value, json};
use wasq_guest::{Error, events, info, runs};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    value: Option<u64>,
    fan_out: Option<u64>,
    child: Option<String>,
    call: Option<String>,
    send: Option<String>,
    data: Option<Value>,
}

fn family(input: Input) -> Result<Value, Error> {
    if let Some(n) = input.fan_out {
        let child = input.child.as_deref().unwrap_or("square");
        let ids: Vec<String> = (1..=n)
            .map(|i| runs::invoke(&format!("start-{i}"), child, &json!({ "value": i })))
            .collect::<Result<_, _>>()?;
        let mut sum = 0;
        for (i, id) in ids.iter().enumerate() {
            let square: u64 = runs::join(&format!("join-{i}"), id)?;
            sum += square;
        }
        return Ok(json!({ "sum": sum, "children": ids }));
    }
    if let Some(function) = input.call {
        let out: Value = runs::call("call", &function, &json!({ "value": input.value }))?;
        return Ok(json!({ "called": out }));
    }
    if let Some(event) = input.send {
        events::send("send", &event, &input.data.unwrap_or(Value::Null))?;
        return Ok(json!({ "sent": true }));
    }
    let n = input.value.ok_or_else(|| Error::fatal("no value"))?;
    info!("child {n}");
    Ok(json!(n * n))
}

wasq_guest::task!(family);
