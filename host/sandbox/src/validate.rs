//! What an upload must be before it is compiled (a component binary, only the enabled
//! WebAssembly features, imports this host provides), and the words a refusal uses.

use super::*;

impl From<CompileError> for InvalidComponent {
    fn from(e: CompileError) -> Self {
        match e {
            CompileError::Timeout(limit) => InvalidComponent::CompileTimeout(limit),
            CompileError::Memory(limit) => InvalidComponent::CompileMemory(limit),
            CompileError::Failed(msg) => compile_refusal(msg),
        }
    }
}

/// Only WebAssembly component binaries pass: never WAT text (wasmtime would parse it),
/// never a precompiled artifact (only this host's own artifacts are ever deserialized).
pub(crate) fn check_header(bytes: &[u8]) -> Result<(), InvalidComponent> {
    if bytes.starts_with(b"\x7fELF") {
        return Err(InvalidComponent::Precompiled);
    }
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(InvalidComponent::NotWasm);
    }
    match bytes[4..8] {
        [0x01, 0x00, 0x00, 0x00] => Err(InvalidComponent::CoreModule),
        [0x0d, 0x00, 0x01, 0x00] => Ok(()),
        ref other => Err(InvalidComponent::Compile(format!(
            "unsupported WebAssembly binary version {other:02x?} (a component has 0d 00 01 00)"
        ))),
    }
}

/// WebAssembly features outside [`engine::ALLOWED_FEATURES`], by what wasmparser's and
/// Cranelift's validation errors say about them (checked in this order).
pub(crate) const FEATURE_ERRORS: &[(&str, &str)] = &[
    ("shared-everything", "shared-everything threads"),
    ("threads", "threads (shared memory and atomics)"),
    ("memory64", "memory64 (64-bit memories and tables)"),
    ("multiple memories", "multi-memory"),
    ("exceptions", "exception handling"),
    ("function references", "typed function references"),
    ("gc proposal", "garbage collection (GC)"),
    ("gc feature", "garbage collection (GC)"),
    ("`gc` proposal", "garbage collection (GC)"),
    ("stack switching", "stack switching"),
    ("custom page sizes", "custom page sizes"),
    ("wide arithmetic", "wide arithmetic"),
    ("custom descriptors", "custom descriptors"),
    ("component model async", "component model async"),
    ("more async builtins", "component model async"),
    ("async stackful", "component model async"),
    ("component model threading", "component model threading"),
    ("component model gc", "component model GC"),
    ("cm-gc", "component model GC"),
    ("component model `value`s", "component model values"),
];

/// Phrases of validation errors about a disabled feature.
pub(crate) const DISABLED_PHRASES: &[&str] = &[
    "not enabled",
    "must be enabled",
    "required for",
    "require the",
    "requires the",
    "not supported",
    "is disabled",
    "multiple memories",
];

/// A compile failure, or the unsupported WebAssembly feature it is about.
pub(crate) fn compile_refusal(msg: String) -> InvalidComponent {
    let lower = msg.to_ascii_lowercase();
    if DISABLED_PHRASES.iter().any(|p| lower.contains(p))
        && let Some((_, feature)) = FEATURE_ERRORS.iter().find(|(n, _)| lower.contains(n))
    {
        return InvalidComponent::UnsupportedFeature {
            feature,
            detail: msg,
        };
    }
    InvalidComponent::Compile(msg)
}

/// Interfaces the linker provides, by name without version.
pub(crate) const PROVIDED: &[&str] = &[
    "wasi:cli/",
    "wasi:clocks/",
    "wasi:filesystem/",
    "wasi:http/outgoing-handler",
    "wasi:http/types",
    "wasi:io/",
    "wasi:random/",
    "wasi:sockets/",
    "wasq:task/",
];

/// Names the import that failed to link. wasmtime reports "component imports instance
/// `X`, but a matching implementation was not found in the linker" with the reason as
/// the error's cause; the cause only helps for interfaces we do provide (a version or
/// signature mismatch), for anything else the name says it all.
pub(crate) fn describe_import_error(err: &wasmtime::Error) -> String {
    let top = err.to_string();
    let name = top.split('`').nth(1).unwrap_or_default();
    if name.is_empty() {
        return format!("something this wasq host does not provide ({err:#})");
    }
    let provided = PROVIDED.iter().any(|p| name.starts_with(p));
    let detail: Vec<String> = err.chain().skip(1).map(|c| c.to_string()).collect();
    if provided && !detail.is_empty() {
        format!(
            "`{name}` with a signature this wasq host does not provide ({})",
            detail.join(": ")
        )
    } else {
        format!("`{name}`, which this wasq host does not provide")
    }
}
