//! What each way of bounding a guest's CPU costs: the same guest code compiled with no
//! instrumentation, with fuel metering, with epoch interruption and with both, and run
//! with fuel yields at the interval the sandbox uses (see `attempt.rs`). Core modules in
//! WAT, so that the figures are the instrumentation's alone:
//! - call-heavy: a recursive Fibonacci (a function call per step, as interpreters built as
//!   components — JavaScript, Python — mostly do);
//! - loop-heavy: a counted loop of adds;
//! - instantiate + call: a pooled instance of a module with one trivial export, per run.
//!
//! `cargo bench -p wasq-sandbox --bench limits`. Prints µs per run and each variant's
//! time against the uninstrumented code.

use std::time::Instant;

use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, Linker, Module, PoolingAllocationConfig, Store,
    UpdateDeadline,
};

const GUEST: &str = r#"(module
  (func $fib (export "fib") (param $n i32) (result i32)
    (if (result i32) (i32.lt_u (local.get $n) (i32.const 2))
      (then (local.get $n))
      (else (i32.add
        (call $fib (i32.sub (local.get $n) (i32.const 1)))
        (call $fib (i32.sub (local.get $n) (i32.const 2)))))))
  (func (export "spin") (param $n i32) (result i32)
    (local $acc i32)
    (loop $l
      (local.set $acc (i32.add (local.get $acc) (local.get $n)))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br_if $l (local.get $n)))
    (local.get $acc))
  (func (export "noop") (result i32) (i32.const 0))
  (memory (export "memory") 1))"#;

/// The fuel yield interval the sandbox uses.
const YIELD_EVERY: u64 = 100_000;

#[derive(Clone, Copy)]
struct Variant {
    name: &'static str,
    fuel: bool,
    epoch: bool,
    yields: bool,
}

const VARIANTS: [Variant; 5] = [
    Variant {
        name: "none",
        fuel: false,
        epoch: false,
        yields: false,
    },
    Variant {
        name: "fuel",
        fuel: true,
        epoch: false,
        yields: false,
    },
    Variant {
        name: "fuel + yields",
        fuel: true,
        epoch: false,
        yields: true,
    },
    Variant {
        name: "epoch",
        fuel: false,
        epoch: true,
        yields: false,
    },
    Variant {
        name: "fuel + epoch",
        fuel: true,
        epoch: true,
        yields: false,
    },
];

fn engine(v: Variant) -> Engine {
    let mut cfg = Config::new();
    cfg.consume_fuel(v.fuel).epoch_interruption(v.epoch);
    let mut pool = PoolingAllocationConfig::default();
    pool.total_memories(16)
        .total_core_instances(16)
        .total_tables(16);
    cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&cfg).unwrap()
}

fn store(engine: &Engine, v: Variant) -> Store<()> {
    let mut store = Store::new(engine, ());
    if v.fuel {
        store.set_fuel(u64::MAX).unwrap();
        if v.yields {
            store.fuel_async_yield_interval(Some(YIELD_EVERY)).unwrap();
        }
    }
    if v.epoch {
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|_| Ok(UpdateDeadline::Continue(1)));
    }
    store
}

/// µs per call of `export(arg)` on a fresh store and instance each time, best of 3 rounds.
async fn time(
    engine: &Engine,
    module: &Module,
    v: Variant,
    export: &str,
    arg: Option<i32>,
    n: u32,
) -> f64 {
    let linker = Linker::new(engine);
    let pre = linker.instantiate_pre(module).unwrap();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        for _ in 0..n {
            let mut store = store(engine, v);
            let instance = pre.instantiate_async(&mut store).await.unwrap();
            match arg {
                Some(a) => {
                    let f = instance
                        .get_typed_func::<i32, i32>(&mut store, export)
                        .unwrap();
                    std::hint::black_box(f.call_async(&mut store, a).await.unwrap());
                }
                None => {
                    let f = instance
                        .get_typed_func::<(), i32>(&mut store, export)
                        .unwrap();
                    std::hint::black_box(f.call_async(&mut store, ()).await.unwrap());
                }
            }
        }
        best = best.min(start.elapsed().as_secs_f64() * 1e6 / f64::from(n));
    }
    best
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let workloads: [(&str, &str, Option<i32>, u32); 3] = [
        ("call-heavy: fib(25)", "fib", Some(25), 20),
        ("loop-heavy: 20M adds", "spin", Some(20_000_000), 5),
        ("instantiate + call", "noop", None, 20_000),
    ];
    let mut none = [0.0; 3];
    println!("µs per run, best of 3 (and against no instrumentation):");
    for v in VARIANTS {
        let engine = engine(v);
        let module = Module::new(&engine, wat::parse_str(GUEST).unwrap()).unwrap();
        let mut line = format!("  {:<14}", v.name);
        for (i, (label, export, arg, n)) in workloads.iter().enumerate() {
            let us = rt.block_on(time(&engine, &module, v, export, *arg, *n));
            if v.name == "none" {
                none[i] = us;
            }
            line.push_str(&format!(
                "  {label}: {us:9.2} ({:+.0}%)",
                (us / none[i] - 1.0) * 100.0
            ));
        }
        println!("{line}");
    }
}
