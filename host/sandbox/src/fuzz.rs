//! Property tests of the upload validator: mutated components and random bytes get
//! `Ok(digest)` or a typed [`InvalidComponent`] with a sentence, within the compile time
//! bound — never a panic, never a hang; and the classifiers of compiler and linker errors
//! (`compile_refusal`, `describe_import_error`) take any text.
//!
//! Compiles run in process here (`Compiler::InProcess`) for speed: a panic inside
//! Cranelift would surface as "the compiler crashed", which the properties refuse too.
//! Case counts are per target; `PROPTEST_CASES=N` sets them all for a longer run.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};

use super::*;

fn cases(default: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        // A failure prints its (shrunk) input; keep it as a regular test.
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = default;
    }
    config
}

const COMPILE_TIMEOUT: Duration = Duration::from_secs(10);

/// Components to mutate: one that validates, one with an import wasq does not provide,
/// ones using refused features, and the empty component.
fn seeds() -> Vec<Vec<u8>> {
    let core = |body: &str| {
        wat::parse_str(format!(
            "(component (core module $m {body}) (core instance (instantiate $m)))"
        ))
        .unwrap()
    };
    vec![
        wat::parse_str(crate::tests::TEST_COMPONENT).unwrap(),
        wat::parse_str(
            r#"(component
                (import "wasi:keyvalue/store@0.2.0-draft" (instance (export "x" (func))))
                (import "wasi:io/streams@0.2.0" (instance (export "y" (func)))))"#,
        )
        .unwrap(),
        core("(memory 1 1 shared)"),
        core("(memory i64 1)"),
        core("(func (result v128) v128.const i64x2 0 0)"),
        wat::parse_str("(component)").unwrap(),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(prop::sample::Index, u8),
    Insert(prop::sample::Index, u8),
    Remove(prop::sample::Index),
    Truncate(prop::sample::Index),
    /// Copies a run of bytes over another place: section and LEB128 lengths move around.
    Copy(prop::sample::Index, prop::sample::Index, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // Bytes that matter in LEB128 lengths and type codes.
    let byte = prop_oneof![
        any::<u8>(),
        prop::sample::select(vec![0x00, 0x01, 0x7f, 0x80, 0xff, 0x40, 0x60, 0x0b]),
    ];
    let at = any::<prop::sample::Index>;
    prop_oneof![
        4 => (at(), byte.clone()).prop_map(|(i, b)| Mutation::Set(i, b)),
        2 => (at(), byte).prop_map(|(i, b)| Mutation::Insert(i, b)),
        2 => at().prop_map(Mutation::Remove),
        1 => at().prop_map(Mutation::Truncate),
        1 => (at(), at(), 1usize..16).prop_map(|(a, b, n)| Mutation::Copy(a, b, n)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    match m {
        Mutation::Set(i, b) => {
            let i = i.index(bytes.len());
            bytes[i] = *b;
        }
        Mutation::Insert(i, b) => bytes.insert(i.index(bytes.len() + 1), *b),
        Mutation::Remove(i) => {
            bytes.remove(i.index(bytes.len()));
        }
        Mutation::Truncate(i) => bytes.truncate(i.index(bytes.len())),
        Mutation::Copy(from, to, n) => {
            let from = from.index(bytes.len());
            let to = to.index(bytes.len());
            let n = (*n).min(bytes.len() - from).min(bytes.len() - to);
            let run = bytes[from..from + n].to_vec();
            bytes[to..to + n].copy_from_slice(&run);
        }
    }
}

/// Validates and checks the answer; returns what it was (`accepted` or the refusal's kind).
async fn check(sb: &Sandbox, bytes: &[u8]) -> Result<&'static str, TestCaseError> {
    let answer = tokio::time::timeout(COMPILE_TIMEOUT * 3, sb.validate(bytes))
        .await
        .map_err(|_| TestCaseError::fail("validate outlived three times its compile bound"))?;
    match answer {
        Ok(digest) => {
            prop_assert_eq!(&digest, &Sandbox::digest(bytes));
            prop_assert!(sb.is_loaded(&digest));
            Ok("accepted")
        }
        Err(e) => {
            let message = e.to_string();
            prop_assert!(message.len() > 20, "{:?}", e);
            prop_assert!(
                !message.contains("crashed"),
                "the compiler panicked: {}",
                message
            );
            let by_header = match &e {
                InvalidComponent::Precompiled => Some("precompiled"),
                InvalidComponent::NotWasm => Some("not wasm"),
                InvalidComponent::CoreModule => Some("core module"),
                _ => None,
            };
            prop_assert_eq!(by_header, header_kind(bytes), "{:?}", e);
            prop_assert!(
                !matches!(e, InvalidComponent::CompileTimeout(_)),
                "a {}-byte input took the whole compile bound",
                bytes.len()
            );
            Ok(match e {
                InvalidComponent::TooLarge { .. } => "too large",
                InvalidComponent::NotWasm => "not wasm",
                InvalidComponent::Precompiled => "precompiled",
                InvalidComponent::CoreModule => "core module",
                InvalidComponent::Compile(_) => "compile",
                InvalidComponent::UnsupportedFeature { .. } => "feature",
                InvalidComponent::CompileTimeout(_) => "timeout",
                InvalidComponent::CompileMemory(_) => "memory",
                InvalidComponent::UnsupportedImport(_) => "import",
                InvalidComponent::MissingExport(_) => "export",
            })
        }
    }
}

/// What the first eight bytes alone decide, as `check_header` is documented.
fn header_kind(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x7fELF") {
        Some("precompiled")
    } else if bytes.len() < 8 || !bytes.starts_with(b"\0asm") {
        Some("not wasm")
    } else if bytes[4..8] == [1, 0, 0, 0] {
        Some("core module")
    } else {
        None
    }
}

fn runner_sandbox() -> (tokio::runtime::Runtime, Sandbox) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sb = Sandbox::new(SandboxConfig {
        max_instances: 2,
        compiler: Compiler::InProcess,
        compile_timeout: COMPILE_TIMEOUT,
        ..SandboxConfig::default()
    })
    .unwrap();
    (rt, sb)
}

#[test]
fn mutated_components_are_accepted_or_refused_with_a_reason() {
    let (rt, sb) = runner_sandbox();
    let seeds = seeds();
    let strategy = (
        prop::sample::select((0..seeds.len()).collect::<Vec<_>>()),
        prop::collection::vec(mutation(), 1..3),
    );
    let kinds = std::sync::Mutex::new(std::collections::BTreeMap::<&str, u32>::new());
    let mut runner = TestRunner::new(cases(1500));
    let result = runner.run(&strategy, |(seed, mutations)| {
        let mut bytes = seeds[seed].clone();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        let kind = rt.block_on(check(&sb, &bytes))?;
        *kinds.lock().unwrap().entry(kind).or_default() += 1;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // The seeds themselves: the first validates, the others are refused.
    let want = [
        "accepted", "import", "feature", "feature", "export", "export",
    ];
    for (seed, want) in seeds.iter().zip(want) {
        assert_eq!(rt.block_on(check(&sb, seed)).unwrap(), want);
    }
    eprintln!("mutated components: {:?}", kinds.into_inner().unwrap());
}

#[test]
fn random_bytes_are_refused_with_a_reason() {
    let (rt, sb) = runner_sandbox();
    let headers = prop::sample::select(vec![
        &b""[..],
        b"\0asm",
        b"\0asm\x0d\0\x01\0",
        b"\0asm\x01\0\0\0",
        b"\0asm\x0e\0\x01\0",
        b"\x7fELF",
    ]);
    let strategy = (headers, prop::collection::vec(any::<u8>(), 0..96));
    let mut runner = TestRunner::new(cases(1500));
    let result = runner.run(&strategy, |(header, tail)| {
        let bytes = [header, &tail[..]].concat();
        rt.block_on(check(&sb, &bytes)).map(drop)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

proptest! {
    #![proptest_config(cases(3000))]

    /// Any compiler message: a feature named only when the message says it is disabled,
    /// with the message kept whole as the detail.
    #[test]
    fn compile_refusals_classify_any_message(
        message in prop_oneof![
            ".{0,40}",
            r"(threads|memory64|exceptions|gc proposal|multiple memories|x)( support)? (is )?(not enabled|not supported|required for|zzz)",
        ],
    ) {
        let lower = message.to_ascii_lowercase();
        match compile_refusal(message.clone()) {
            InvalidComponent::UnsupportedFeature { feature, detail } => {
                prop_assert_eq!(detail, message);
                prop_assert!(DISABLED_PHRASES.iter().any(|p| lower.contains(p)));
                let named = FEATURE_ERRORS.iter().any(|(n, f)| *f == feature && lower.contains(n));
                prop_assert!(named, "{} for {}", feature, lower);
            }
            InvalidComponent::Compile(m) => prop_assert_eq!(m, message),
            other => prop_assert!(false, "{:?}", other),
        }
    }

    /// Any linker error: a sentence naming the import when the error names one.
    #[test]
    fn import_errors_describe_any_message(
        top in prop_oneof![
            ".{0,40}",
            "component imports instance `[a-z:/@.0-9`-]{0,30}`, but a matching implementation was not found",
        ],
        causes in prop::collection::vec(".{0,20}", 0..3),
    ) {
        // `top`, caused by causes[0], caused by causes[1], ...
        let mut chain = causes.iter().rev();
        let mut err = match chain.next() {
            Some(deepest) => wasmtime::Error::msg(deepest.clone()),
            None => wasmtime::Error::msg(top.clone()),
        };
        for c in chain {
            err = err.context(c.clone());
        }
        if !causes.is_empty() {
            err = err.context(top.clone());
        }
        prop_assert_eq!(err.chain().count(), causes.len() + 1);
        let described = describe_import_error(&err);
        prop_assert!(!described.is_empty());
        if let Some(name) = top.split('`').nth(1).filter(|n| !n.is_empty()) {
            prop_assert!(described.contains(&format!("`{name}`")), "{}", described);
        }
    }
}
