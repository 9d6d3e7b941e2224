use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use wasq_core::StoreError;

/// Errors of the library's entry points.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot use data folder {path}: {source}")]
    DataDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error(
        "data folder {path} is writable by other users (mode {mode:03o}): its files cannot be trusted; use a folder only you can write to"
    )]
    DataDirUnsafe { path: std::path::PathBuf, mode: u32 },
    #[error("{path} is open to other users (mode {mode:03o}) and cannot be made private: {source}")]
    DataDirLoose {
        path: std::path::PathBuf,
        mode: u32,
        source: std::io::Error,
    },
    #[error("data folder {0} is in use by another wasq process")]
    DataDirInUse(std::path::PathBuf),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot use Redis at {target}: {source}")]
    Redis { target: String, source: StoreError },
    #[error("sandbox: {0}")]
    Sandbox(#[from] wasq_sandbox::SandboxError),
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// The one error type of the HTTP edge: a status and a sentence, as
/// `{"error": {"code": "...", "message": "..."}}`, and a `Retry-After` header (whole
/// seconds, rounded up) when `retry_after_ms` is set.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub retry_after_ms: Option<u64>,
}

impl ApiError {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code,
            message: message.into(),
            retry_after_ms: None,
        }
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: message.into(),
            retry_after_ms: None,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(what) => ApiError::not_found(format!("{what} not found")),
            StoreError::Conflict(message) => ApiError {
                status: StatusCode::CONFLICT,
                code: "conflict",
                message,
                retry_after_ms: None,
            },
            StoreError::QuotaExceeded {
                message,
                retry_after_ms,
            } => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: "quota_exceeded",
                message,
                retry_after_ms: Some(retry_after_ms),
            },
            // 507, not 429: waiting does not help; deleting runs or a bigger quota does.
            StoreError::StorageQuota(message) => ApiError {
                status: StatusCode::INSUFFICIENT_STORAGE,
                code: "storage_quota",
                message,
                retry_after_ms: None,
            },
            StoreError::Full(_) => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "store_full",
                message: e.to_string(),
                retry_after_ms: Some(30_000),
            },
            StoreError::Unavailable(_) => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "unavailable",
                message: e.to_string(),
                retry_after_ms: None,
            },
            e => {
                tracing::error!(error = %e, "store failure");
                ApiError {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    code: "internal",
                    message: e.to_string(),
                    retry_after_ms: None,
                }
            }
        }
    }
}

/// The body of every error answer, as the OpenAPI document describes it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody {
    pub(crate) error: ErrorDetail,
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorDetail {
    /// What went wrong, for programs: `not_found`, `bad_query`, `quota_exceeded`, ...
    #[schema(example = "not_found")]
    pub(crate) code: &'static str,
    /// The same in words, for people.
    pub(crate) message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
            },
        };
        let mut resp = (self.status, Json(body)).into_response();
        if let Some(ms) = self.retry_after_ms {
            let secs = ms.div_ceil(1000).max(1);
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        resp
    }
}
