//! The compile child, exactly as the shipped binary uses it: this test binary has its own
//! `main` (`harness = false`) that calls `compile_child_main()` first, so
//! `Compiler::CurrentExe` re-executes this very executable to compile.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use wasq_core::{Limits, LogLine, Progress};
use wasq_sandbox::{
    AttemptSpec, Compiler, InvalidComponent, Journal, JournalError, RunInfo, Sandbox, SandboxConfig,
};

fn main() {
    wasq_sandbox::compile_child_main();
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let tests: &[(&str, fn())] = &[
        ("compiles_and_runs_in_a_child", compiles_and_runs_in_a_child),
        (
            "refusals_come_back_from_the_child",
            refusals_come_back_from_the_child,
        ),
        (
            "a_slow_compile_is_killed_at_the_time_bound",
            a_slow_compile_is_killed_at_the_time_bound,
        ),
        (
            "a_hungry_compile_is_stopped_at_the_memory_bound",
            a_hungry_compile_is_stopped_at_the_memory_bound,
        ),
        (
            "a_missing_helper_is_refused_at_start",
            a_missing_helper_is_refused_at_start,
        ),
    ];
    let mut ran = 0;
    for (name, test) in tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let t = Instant::now();
        test();
        println!("test {name} ... ok ({:?})", t.elapsed());
        ran += 1;
    }
    println!("test result: ok. {ran} passed");
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn sandbox(tweak: impl FnOnce(&mut SandboxConfig)) -> Sandbox {
    let mut config = SandboxConfig {
        max_instances: 2,
        compiler: Compiler::CurrentExe,
        ..SandboxConfig::default()
    };
    tweak(&mut config);
    Sandbox::new(config).unwrap()
}

/// Echoes its input.
const ECHO: &str = r#"
(component
  (core module $m
    (memory (export "memory") 1)
    (global $heap (mut i32) (i32.const 1024))
    (func (export "cabi_realloc") (param i32 i32 i32) (param $size i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and (i32.add (global.get $heap) (i32.const 7)) (i32.const -8)))
      (global.set $heap (i32.add (local.get $p) (local.get $size)))
      (block $ok
        (loop $grow
          (br_if $ok (i32.le_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536))))
          (if (i32.eq (memory.grow (i32.const 1)) (i32.const -1)) (then unreachable))
          (br $grow)))
      (local.get $p))
    (func (export "run") (param $ptr i32) (param $len i32) (result i32)
      (i32.store8 (i32.const 0) (i32.const 0))
      (i32.store (i32.const 8) (local.get $ptr))
      (i32.store (i32.const 12) (local.get $len))
      (i32.const 0)))
  (core instance $i (instantiate $m))
  (type $run-error' (variant
    (case "retryable" string)
    (case "fatal" string)
    (case "retry-after" (tuple u64 string))))
  (export $run-error "run-error" (type $run-error'))
  (func (export "run") (param "input" (list u8)) (result (result (list u8) (error $run-error)))
    (canon lift (core func $i "run") (memory (core memory $i "memory"))
      (realloc (core func $i "cabi_realloc"))))
)
"#;

/// A valid component that takes Cranelift a while: `funcs` functions of `ops` arithmetic
/// statements each (about 0.35 s per MB of wasm on the 2-core dev VM).
fn slow_component(funcs: usize, ops: usize) -> Vec<u8> {
    let mut w = String::from("(component (core module $m (memory 1)\n");
    for f in 0..funcs {
        w.push_str(&format!(
            "(func $f{f} (param i32) (result i32) (local i32 i32 i32 i32 i32 i32 i32 i32)\n"
        ));
        for i in 0..ops {
            let a = i % 8 + 1;
            let b = (i * 7 + 3) % 8 + 1;
            w.push_str(&format!(
                "(local.set {a} (i32.add (local.get {b}) (i32.mul (local.get {a}) \
                 (i32.load offset={} (local.get 0)))))\n",
                (i * 4) % 60000
            ));
        }
        w.push_str("(local.get 1))\n");
    }
    w.push_str(") (core instance (instantiate $m)))");
    wat::parse_str(&w).unwrap()
}

struct Nop(Mutex<Vec<LogLine>>);

#[async_trait::async_trait]
impl Journal for Nop {
    async fn complete_step(&self, _: &str, _: u32, _: &[u8]) -> Result<(), JournalError> {
        Ok(())
    }
    async fn send_event(&self, _: &str, _: serde_json::Value, _: &str) -> Result<(), JournalError> {
        Ok(())
    }
    async fn start_run(&self, _: &str, _: &[u8], _: &str) -> Result<String, JournalError> {
        Err(JournalError::Failed("no runs here".into()))
    }
    async fn load_step(&self, _: &str, _: u32) -> Result<Vec<u8>, JournalError> {
        Err(JournalError::Failed("no stored steps here".into()))
    }
    fn log(&self, line: LogLine) {
        self.0.lock().unwrap().push(line);
    }
    fn progress(&self, _: Progress) {}
}

fn compiles_and_runs_in_a_child() {
    block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let sb = sandbox(|c| c.cache_dir = Some(dir.path().into()));
        let bytes = wat::parse_str(ECHO).unwrap();
        let digest = sb.validate(&bytes).await.unwrap();
        let r = sb
            .run(AttemptSpec {
                digest: digest.clone(),
                info: RunInfo::default(),
                input: b"hello".to_vec(),
                limits: Limits::default(),
                steps: vec![],
                journal: Arc::new(Nop(Mutex::default())),
                cancel: CancellationToken::new(),
                allow_hosts: vec![],
                traceparent: None,
                max_outbound_requests: None,
            })
            .await;
        assert_eq!(r.outcome.output(), Some(&b"hello"[..]), "{r:?}");
        // The child's artifact went to the disk cache, which another sandbox loads.
        let other = sandbox(|c| c.cache_dir = Some(dir.path().into()));
        other.load(&digest, &bytes).await.unwrap();
        assert!(other.is_loaded(&digest));
    });
}

fn refusals_come_back_from_the_child() {
    block_on(async {
        let sb = sandbox(|_| {});
        let threads = wat::parse_str("(component (core module (memory 1 1 shared)) )").unwrap();
        let err = sb.validate(&threads).await.unwrap_err();
        assert!(
            matches!(err, InvalidComponent::UnsupportedFeature { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("uses threads"), "{err}");

        let unknown = wat::parse_str(
            r#"(component (import "foo:bar/baz@1.0.0" (instance (export "f" (func)))))"#,
        )
        .unwrap();
        let err = sb.validate(&unknown).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("`foo:bar/baz@1.0.0`, which this wasq host does not provide"),
            "{err}"
        );

        // Bytes that pass the header check but are no component.
        let mut garbage = b"\0asm\x0d\x00\x01\x00".to_vec();
        garbage.extend_from_slice(&[0xff; 64]);
        let err = sb.validate(&garbage).await.unwrap_err();
        assert!(matches!(err, InvalidComponent::Compile(_)), "{err:?}");
    });
}

fn a_slow_compile_is_killed_at_the_time_bound() {
    let bytes = slow_component(300, 1000);
    block_on(async {
        let sb = sandbox(|c| c.compile_timeout = Duration::from_millis(300));
        let t = Instant::now();
        let err = sb.validate(&bytes).await.unwrap_err();
        let took = t.elapsed();
        assert!(
            matches!(err, InvalidComponent::CompileTimeout(_)),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "compiling the component took longer than the limit of 0.3s"
        );
        assert!(took < Duration::from_secs(2), "took {took:?}");
        // The slot is free again at once: a small component compiles right after.
        let sb_ok = sb.validate(&wat::parse_str(ECHO).unwrap()).await;
        assert!(sb_ok.is_ok(), "{sb_ok:?}");
        println!("  killed after {took:?}");
    });
}

fn a_hungry_compile_is_stopped_at_the_memory_bound() {
    // One huge function: Cranelift needs ~360 MB resident for it (measured).
    let bytes = slow_component(1, 300_000);
    block_on(async {
        let sb = sandbox(|c| c.compile_memory_bytes = 300 << 20);
        let t = Instant::now();
        let err = sb.validate(&bytes).await.unwrap_err();
        assert!(matches!(err, InvalidComponent::CompileMemory(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "compiling the component needed more memory than the limit of 300 MiB"
        );
        println!("  stopped after {:?}", t.elapsed());
    });
}

fn a_missing_helper_is_refused_at_start() {
    let err = Sandbox::new(SandboxConfig {
        max_instances: 1,
        compiler: Compiler::Program("/nonexistent/wasq".into()),
        ..SandboxConfig::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
}
