//! Unit tests of the sandbox: real components under every limit. One file of scenarios
//! (over 600 lines: each test reads on its own, sharing only the builders at the top).

use std::path::{Path, PathBuf};

use super::*;

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        max_instances: 4,
        ..SandboxConfig::default()
    })
    .unwrap()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

#[test]
fn vendored_wasi_wit_matches_wasmtime() {
    let root = workspace_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(&root)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let crate_dir = |name: &str| {
        let manifest = meta["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["manifest_path"].as_str())
            .unwrap_or_else(|| panic!("{name} in cargo metadata"));
        Path::new(manifest).parent().unwrap().to_path_buf()
    };
    // wasi:http from wasmtime-wasi-http, everything else from wasmtime-wasi (the two
    // crates ship identical copies of the shared packages).
    let wasi = crate_dir("wasmtime-wasi").join("src/p2/wit/deps");
    let wasi_http = crate_dir("wasmtime-wasi-http").join("wit/deps");

    let vendored = root.join("wit/deps");
    let mut files: Vec<_> = std::fs::read_dir(&vendored)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wit"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no WIT files in {}: run wit/vendor.sh",
        vendored.display()
    );
    assert!(
        files.iter().any(|f| f.ends_with("http.wit")),
        "wit/deps/http.wit missing: run wit/vendor.sh"
    );
    for ours in files {
        let name = ours.file_name().unwrap();
        let theirs = if name == "http.wit" {
            wasi_http.join(name)
        } else {
            wasi.join(name)
        };
        let a = std::fs::read(&ours).unwrap();
        let b = std::fs::read(&theirs).unwrap_or_default();
        assert!(
            a == b,
            "{} differs from {} (wasmtime's copy): run wit/vendor.sh",
            ours.display(),
            theirs.display()
        );
    }
}

#[tokio::test]
async fn validate_refuses_random_bytes() {
    let err = sandbox()
        .validate(b"definitely not wasm at all")
        .await
        .unwrap_err();
    assert!(matches!(err, InvalidComponent::NotWasm), "{err:?}");
    assert!(
        err.to_string().contains("not a WebAssembly binary"),
        "{err}"
    );
}

#[tokio::test]
async fn validate_refuses_a_core_module() {
    let module = wat::parse_str("(module)").unwrap();
    let err = sandbox().validate(&module).await.unwrap_err();
    assert!(matches!(err, InvalidComponent::CoreModule), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("core WebAssembly module") && msg.contains("wasm32-wasip2"),
        "{msg}"
    );
}

#[tokio::test]
async fn validate_refuses_a_component_without_run() {
    let component = wat::parse_str("(component)").unwrap();
    let sb = sandbox();
    let err = sb.validate(&component).await.unwrap_err();
    assert!(matches!(err, InvalidComponent::MissingExport(_)), "{err:?}");
    assert!(err.to_string().contains("does not export `run"), "{err}");
    assert!(!sb.is_loaded(&Sandbox::digest(&component)));
}

#[tokio::test]
async fn validate_refuses_an_oversized_upload() {
    let sb = Sandbox::new(SandboxConfig {
        max_instances: 1,
        max_component_bytes: 16,
        ..SandboxConfig::default()
    })
    .unwrap();
    let err = sb.validate(&[0u8; 17]).await.unwrap_err();
    assert!(
        matches!(err, InvalidComponent::TooLarge { size: 17, max: 16 }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("17 bytes, over the upload limit of 16"),
        "{err}"
    );
}

#[tokio::test]
async fn validate_refuses_unprovided_imports_by_name() {
    let component = wat::parse_str(
        r#"(component
            (import "wasi:keyvalue/store@0.2.0-draft" (instance
                (export "x" (func))
            ))
        )"#,
    )
    .unwrap();
    let err = sandbox().validate(&component).await.unwrap_err();
    assert!(
        matches!(err, InvalidComponent::UnsupportedImport(_)),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("`wasi:keyvalue/store@0.2.0-draft`, which this wasq host does not provide"),
        "{err}"
    );
}

#[test]
fn digest_is_lowercase_sha256_hex() {
    assert_eq!(
        Sandbox::digest(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[tokio::test]
async fn run_of_an_unloaded_digest_is_a_host_error() {
    let r = sandbox()
        .run(AttemptSpec {
            digest: "00".repeat(32),
            info: RunInfo::default(),
            input: vec![],
            limits: Limits::default(),
            steps: vec![],
            journal: Arc::new(Nop),
            cancel: CancellationToken::new(),
            allow_hosts: vec![],
            traceparent: None,
            max_outbound_requests: None,
        })
        .await;
    let err = r.outcome.error().cloned().unwrap();
    assert_eq!(err.error.reason, ErrorReason::Host);
    assert!(
        err.error.message.contains("not loaded"),
        "{}",
        err.error.message
    );
}

/// A hand-written component exporting `run`, so that run() is tested without a guest
/// toolchain. The first input byte picks the behaviour: `e` echoes the input, `f` fails
/// fatally with the input as message, `r` asks to retry after 1500 ms, `s` spins forever,
/// `g` grows memory by 125 MiB (trapping if refused), `u` traps.
pub(crate) const TEST_COMPONENT: &str = r#"
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
      (local $op i32)
      (if (i32.eqz (local.get $len)) (then unreachable))
      (local.set $op (i32.load8_u (local.get $ptr)))
      (if (i32.eq (local.get $op) (i32.const 115)) (then (loop $l (br $l))))
      (if (i32.eq (local.get $op) (i32.const 103))
        (then (if (i32.eq (memory.grow (i32.const 2000)) (i32.const -1)) (then unreachable))))
      (if (i32.eq (local.get $op) (i32.const 117)) (then unreachable))
      (if (i32.eq (local.get $op) (i32.const 102))
        (then
          (i32.store8 (i32.const 0) (i32.const 1))
          (i32.store8 (i32.const 8) (i32.const 1))
          (i32.store (i32.const 16) (local.get $ptr))
          (i32.store (i32.const 20) (local.get $len))
          (return (i32.const 0))))
      (if (i32.eq (local.get $op) (i32.const 114))
        (then
          (i32.store8 (i32.const 0) (i32.const 1))
          (i32.store8 (i32.const 8) (i32.const 2))
          (i64.store (i32.const 16) (i64.const 1500))
          (i32.store (i32.const 24) (local.get $ptr))
          (i32.store (i32.const 28) (local.get $len))
          (return (i32.const 0))))
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

struct Nop;

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
    fn log(&self, _: LogLine) {}
    fn progress(&self, _: Progress) {}
}

async fn loaded() -> (Sandbox, String) {
    let sb = sandbox();
    let digest = sb
        .validate(&wat::parse_str(TEST_COMPONENT).unwrap())
        .await
        .unwrap();
    (sb, digest)
}

fn spec(digest: &str, input: &str, limits: Limits) -> AttemptSpec {
    AttemptSpec {
        digest: digest.into(),
        info: RunInfo::default(),
        input: input.as_bytes().to_vec(),
        limits,
        steps: vec![],
        journal: Arc::new(Nop),
        cancel: CancellationToken::new(),
        allow_hosts: vec![],
        traceparent: None,
        max_outbound_requests: None,
    }
}

fn reason(r: &AttemptResult) -> (ErrorReason, String) {
    let e = r.outcome.error().unwrap();
    (e.error.reason, e.error.message.clone())
}

#[tokio::test]
async fn run_returns_output_and_guest_errors() {
    let (sb, d) = loaded().await;
    let r = sb.run(spec(&d, "echo", Limits::default())).await;
    assert_eq!(r.outcome.output(), Some(&b"echo"[..]));
    assert!(r.fuel_used > 0 && r.peak_memory_bytes >= 65536, "{r:?}");

    let r = sb
        .run(spec(&d, "fatal: no such user", Limits::default()))
        .await;
    assert_eq!(
        reason(&r),
        (ErrorReason::Fatal, "fatal: no such user".into())
    );

    let r = sb.run(spec(&d, "rate limited", Limits::default())).await;
    let e = r.outcome.error().cloned().unwrap();
    assert_eq!(
        (e.error.reason, e.retry_after_ms),
        (ErrorReason::RetryAfter, Some(1500))
    );

    let r = sb.run(spec(&d, "u", Limits::default())).await;
    let (why, msg) = reason(&r);
    assert_eq!(why, ErrorReason::Trap);
    assert!(msg.contains("unreachable"), "{msg}");
}

#[tokio::test]
async fn run_output_over_the_cap_is_fatal() {
    let sb = Sandbox::new(SandboxConfig {
        max_instances: 1,
        max_output_bytes: 8,
        ..SandboxConfig::default()
    })
    .unwrap();
    let d = sb
        .validate(&wat::parse_str(TEST_COMPONENT).unwrap())
        .await
        .unwrap();
    let r = sb.run(spec(&d, "echo this back", Limits::default())).await;
    let (why, msg) = reason(&r);
    assert_eq!(why, ErrorReason::Fatal);
    assert!(msg.contains("14 bytes, over the limit of 8 bytes"), "{msg}");
}

#[tokio::test]
async fn run_enforces_fuel_memory_and_time() {
    let (sb, d) = loaded().await;
    let r = sb
        .run(spec(
            &d,
            "s",
            Limits {
                fuel: 1_000_000,
                ..Limits::default()
            },
        ))
        .await;
    assert_eq!(
        reason(&r),
        (
            ErrorReason::OutOfFuel,
            "used up its fuel limit of 1000000".into()
        )
    );
    assert_eq!(r.fuel_used, 1_000_000);

    let r = sb
        .run(spec(
            &d,
            "g",
            Limits {
                memory_bytes: 8 << 20,
                ..Limits::default()
            },
        ))
        .await;
    let (why, msg) = reason(&r);
    assert_eq!(why, ErrorReason::OutOfMemory);
    assert!(msg.ends_with("over the limit of 8388608 bytes"), "{msg}");

    let limits = Limits {
        timeout_ms: 300,
        fuel: u64::MAX,
        ..Limits::default()
    };
    let r = sb.run(spec(&d, "s", limits)).await;
    assert_eq!(
        reason(&r),
        (
            ErrorReason::Timeout,
            "exceeded its time limit of 300ms".into()
        )
    );
    assert!(r.duration < Duration::from_millis(1000), "{:?}", r.duration);
}

/// On a single-threaded runtime a spinning guest must still let timers fire: it yields
/// to the runtime on every epoch tick.
#[tokio::test(flavor = "current_thread")]
async fn a_spinning_guest_does_not_starve_the_runtime() {
    let (sb, d) = loaded().await;
    let mut s = spec(
        &d,
        "s",
        Limits {
            fuel: u64::MAX,
            ..Limits::default()
        },
    );
    let cancel = s.cancel.clone();
    s.cancel = cancel.clone();
    let t = Instant::now();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    });
    let r = sb.run(s).await;
    canceller.await.unwrap();
    assert_eq!(
        reason(&r),
        (ErrorReason::Host, "attempt cancelled: lease lost".into())
    );
    assert!(
        t.elapsed() < Duration::from_millis(600),
        "cancel took {:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn load_uses_the_disk_cache_and_survives_a_corrupt_entry() {
    let dir = tempfile::tempdir().unwrap();
    let config = SandboxConfig {
        cache_dir: Some(dir.path().into()),
        max_instances: 1,
        ..SandboxConfig::default()
    };
    let bytes = wat::parse_str(TEST_COMPONENT).unwrap();
    let d = Sandbox::new(config.clone())
        .unwrap()
        .validate(&bytes)
        .await
        .unwrap();
    let cached: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    assert!(
        cached[0]
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(&d)
    );

    let sb = Sandbox::new(config.clone()).unwrap();
    assert!(!sb.is_loaded(&d));
    let err = sb.load(&d, b"other bytes").await.unwrap_err();
    assert!(err.to_string().contains("do not match"), "{err}");
    sb.load(&d, &bytes).await.unwrap();
    assert!(sb.is_loaded(&d));
    assert_eq!(
        sb.run(spec(&d, "echo", Limits::default()))
            .await
            .outcome
            .output(),
        Some(&b"echo"[..])
    );

    // Replaced, not overwritten in place: the sandbox above has the file mapped, and
    // truncating a mapped file kills the process with SIGBUS.
    let tmp = dir.path().join("tmp");
    std::fs::write(&tmp, b"not an artifact").unwrap();
    std::fs::rename(&tmp, &cached[0]).unwrap();
    let sb = Sandbox::new(config).unwrap();
    sb.load(&d, &bytes).await.unwrap();
    assert_eq!(
        sb.run(spec(&d, "echo", Limits::default()))
            .await
            .outcome
            .output(),
        Some(&b"echo"[..])
    );
    assert_ne!(
        std::fs::read(&cached[0]).unwrap(),
        b"not an artifact",
        "the entry is rewritten"
    );
}

#[tokio::test]
async fn validate_refuses_unsupported_wasm_features_by_name() {
    let sb = sandbox();
    let cases = [
        ("threads", "(memory 1 1 shared)"),
        (
            "threads",
            "(memory 1 1) (func (result i32) i32.const 0 i32.atomic.load)",
        ),
        ("memory64", "(memory i64 1)"),
        ("garbage collection", "(type (struct (field i32)))"),
        (
            "typed function references",
            "(type $t (func)) (func (param (ref $t)))",
        ),
        ("exception handling", "(tag $e) (func (throw $e))"),
        ("multi-memory", "(memory 1) (memory 1)"),
        ("custom page sizes", "(memory 1 (pagesize 1))"),
        (
            "wide arithmetic",
            "(func (param i64 i64 i64 i64) (result i64 i64) local.get 0 local.get 1 \
             local.get 2 local.get 3 i64.add128)",
        ),
    ];
    for (feature, body) in cases {
        let wat = format!("(component (core module $m {body}) (core instance (instantiate $m)))");
        let err = sb
            .validate(&wat::parse_str(&wat).unwrap())
            .await
            .unwrap_err();
        assert!(
            matches!(err, InvalidComponent::UnsupportedFeature { .. }),
            "{feature}: {err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("the component uses {feature}"))
                && msg.contains("a WebAssembly feature wasq does not support"),
            "{msg}"
        );
    }
    // Supported features pass validation (and fail later, for want of `run`).
    for body in [
        "(func (result v128) v128.const i64x2 0 0)",
        "(func $f (return_call $f))",
        "(memory 1) (func (memory.fill (i32.const 0) (i32.const 0) (i32.const 0)))",
    ] {
        let wat = format!("(component (core module $m {body}) (core instance (instantiate $m)))");
        let err = sb
            .validate(&wat::parse_str(&wat).unwrap())
            .await
            .unwrap_err();
        assert!(
            matches!(err, InvalidComponent::MissingExport(_)),
            "{body}: {err:?}"
        );
    }
}

#[tokio::test]
async fn validate_refuses_a_precompiled_artifact() {
    let engine = wasmtime::Engine::new(&engine::compile_config()).unwrap();
    let cwasm = engine
        .precompile_component(&wat::parse_str(TEST_COMPONENT).unwrap())
        .unwrap();
    let err = sandbox().validate(&cwasm).await.unwrap_err();
    assert!(matches!(err, InvalidComponent::Precompiled), "{err:?}");
    assert!(
        err.to_string().contains("precompiled artifact (.cwasm)"),
        "{err}"
    );
    // Nor is WAT text compiled, though wasmtime would accept it.
    let err = sandbox()
        .validate(TEST_COMPONENT.as_bytes())
        .await
        .unwrap_err();
    assert!(matches!(err, InvalidComponent::NotWasm), "{err:?}");
}

#[test]
fn current_exe_without_the_hook_is_refused() {
    // This test binary's main (libtest's) never called compile_child_main: re-executing
    // it would run the test suite, not a compiler.
    let err = Sandbox::new(SandboxConfig {
        max_instances: 1,
        compiler: Compiler::CurrentExe,
        ..SandboxConfig::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("compile_child_main"), "{err}");
}

#[tokio::test]
async fn a_slow_in_process_compile_is_abandoned_at_the_time_bound() {
    let sb = Sandbox::new(SandboxConfig {
        max_instances: 1,
        compiler: Compiler::InProcess,
        compile_timeout: Duration::from_millis(50),
        ..SandboxConfig::default()
    })
    .unwrap();
    let mut w = String::from("(component (core module");
    for _ in 0..200 {
        w.push_str("(func (param i32) (result i32)");
        w.push_str(&"(local.get 0) (i32.const 3) (i32.mul) (local.set 0)".repeat(500));
        w.push_str("(local.get 0))");
    }
    w.push_str("))");
    let err = sb.validate(&wat::parse_str(&w).unwrap()).await.unwrap_err();
    assert!(
        matches!(err, InvalidComponent::CompileTimeout(_)),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "compiling the component took longer than the limit of 0.05s"
    );
}

/// The table of linked components is bounded: past `max_loaded_components` the least
/// recently used goes (and a run of it loads it again); the disk cache keeps at most
/// `max_cached_artifacts` files.
#[tokio::test]
async fn loaded_components_and_cached_artifacts_are_bounded() {
    let cache = tempfile::tempdir().unwrap();
    let sb = Sandbox::new(SandboxConfig {
        max_instances: 4,
        max_loaded_components: 2,
        max_cached_artifacts: 2,
        cache_dir: Some(cache.path().to_path_buf()),
        compiler: Compiler::InProcess,
        ..SandboxConfig::default()
    })
    .unwrap();
    // Three different components: the heap starts at another address in each.
    let variant = |i: u32| {
        wat::parse_str(
            TEST_COMPONENT.replace("(i32.const 1024)", &format!("(i32.const {})", 1024 + 8 * i)),
        )
        .unwrap()
    };
    let mut digests = vec![];
    for i in 0..3 {
        digests.push(sb.validate(&variant(i)).await.unwrap());
        if i == 1 {
            // Used since: the first one is now the most recent.
            assert_eq!(
                sb.run(spec(&digests[0], "echo", Limits::default()))
                    .await
                    .outcome
                    .output(),
                Some(&b"echo"[..])
            );
        }
    }
    assert!(sb.is_loaded(&digests[0]), "recently used, kept");
    assert!(!sb.is_loaded(&digests[1]), "least recently used, dropped");
    assert!(sb.is_loaded(&digests[2]));
    let files = std::fs::read_dir(cache.path()).unwrap().count();
    assert_eq!(files, 2, "the disk cache keeps two artifacts");
    // A dropped component loads again when needed.
    sb.load(&digests[1], &variant(1)).await.unwrap();
    assert_eq!(
        sb.run(spec(&digests[1], "echo", Limits::default()))
            .await
            .outcome
            .output(),
        Some(&b"echo"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loads_wanted_at_once_fetch_the_component_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let sb = sandbox();
    let bytes = wat::parse_str(TEST_COMPONENT).unwrap();
    let digest = Sandbox::digest(&bytes);
    let fetched = Arc::new(AtomicUsize::new(0));
    let loads: Vec<_> = (0..8)
        .map(|_| {
            let (sb, bytes, digest, fetched) =
                (sb.clone(), bytes.clone(), digest.clone(), fetched.clone());
            tokio::spawn(async move {
                sb.load_with(&digest, || async {
                    fetched.fetch_add(1, Ordering::SeqCst);
                    // Slow as a read of a big component: the others arrive meanwhile.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    Ok::<_, String>(bytes)
                })
                .await
            })
        })
        .collect();
    for load in loads {
        load.await.unwrap().unwrap();
    }
    assert_eq!(
        fetched.load(Ordering::SeqCst),
        1,
        "one fetch for eight loads"
    );
    assert!(sb.is_loaded(&digest));
    // A fetch that fails is the caller's error, and the next caller fetches again.
    let other = wat::parse_str("(component (core module))").unwrap();
    let d = Sandbox::digest(&other);
    let err = sb
        .load_with(&d, || async { Err::<Vec<u8>, _>("store down") })
        .await
        .unwrap_err();
    assert!(matches!(err, LoadError::Fetch("store down")), "{err}");
    let err = sb
        .load_with(&d, || async { Ok::<_, String>(b"other bytes".to_vec()) })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("do not match"), "{err}");
}
