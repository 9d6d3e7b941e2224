//! API keys: generation, HMAC, and the middleware that turns `Authorization: Bearer KEY`
//! into the [`Caller`] every handler scopes its work to.
//!
//! A key is `wasq_<id>_<secret>`: `id` (12 hex digits) is public and names the key in
//! listings and revocations; `secret` is 128 random bits. The store keeps only
//! HMAC-SHA256(server secret, whole key), compared in constant time, so a copy of the
//! database holds nothing that authenticates. The operator (admin) key is not stored at
//! all: the server compares its HMAC with the configured one.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use wasq_core::{ApiKey, StoreError};

use crate::App;
use crate::error::ApiError;

/// Who is calling: a tenant (through one of its keys) or the operator.
#[derive(Debug, Clone)]
pub(crate) enum Caller {
    Tenant { tenant: String, key_id: String },
    Admin,
}

impl Caller {
    /// For the audit trail.
    pub(crate) fn actor(&self) -> String {
        match self {
            Caller::Tenant { key_id, .. } => format!("key:{key_id}"),
            Caller::Admin => "admin".into(),
        }
    }
}

/// Key material of a server: the HMAC secret (the same on every server sharing a store)
/// and the operator key's HMAC.
#[derive(Clone)]
pub(crate) struct Keyring {
    secret: Arc<Vec<u8>>,
    admin: Option<[u8; 32]>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keyring(..)")
    }
}

impl Keyring {
    pub(crate) fn new(secret: &[u8], admin_key: Option<&str>) -> Keyring {
        let mut ring = Keyring {
            secret: Arc::new(secret.to_vec()),
            admin: None,
        };
        ring.admin = admin_key.map(|k| ring.mac(k));
        ring
    }

    fn mac(&self, key: &str) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.secret)
            .expect("HMAC takes keys of any length");
        mac.update(key.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// A key derived from the server secret for `label` (a tenant's webhook signing key):
    /// the same on every server sharing the secret.
    pub(crate) fn derive(&self, label: &str) -> [u8; 32] {
        self.mac(label)
    }

    /// The hex HMAC stored for `key`.
    pub(crate) fn hmac_hex(&self, key: &str) -> String {
        hex::encode(self.mac(key))
    }

    fn is_admin(&self, key: &str) -> bool {
        self.admin
            .is_some_and(|admin| bool::from(admin.ct_eq(&self.mac(key))))
    }

    pub(crate) fn matches(&self, key: &str, stored_hex: &str) -> bool {
        match hex::decode(stored_hex) {
            Ok(stored) => bool::from(stored.as_slice().ct_eq(&self.mac(key))),
            Err(_) => false,
        }
    }
}

/// Keys this server looked up in the last [`KeyCache::FRESH`], so that a request costs no
/// store round trip for its key. A key revoked through this server is forgotten at once;
/// one revoked through another server sharing the store is refused here within `FRESH`.
/// Unknown keys are not kept (a guessed id costs a lookup, as before).
#[derive(Default)]
pub(crate) struct KeyCache {
    keys: std::sync::Mutex<std::collections::HashMap<String, (ApiKey, std::time::Instant)>>,
    /// Bumped by every `forget`: a lookup that raced a revocation does not keep its key.
    forgotten: std::sync::atomic::AtomicU64,
}

impl KeyCache {
    pub(crate) const FRESH: std::time::Duration = std::time::Duration::from_secs(1);
    /// Keys kept at most (then the cache starts over).
    const MAX: usize = 10_000;

    fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (ApiKey, std::time::Instant)>>
    {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The stored key `id`, from the cache while fresh, else from the store.
    async fn get(&self, app: &App, id: &str) -> Result<Option<ApiKey>, StoreError> {
        if let Some((key, at)) = self.map().get(id)
            && at.elapsed() < Self::FRESH
        {
            return Ok(Some(key.clone()));
        }
        let generation = self.forgotten.load(std::sync::atomic::Ordering::SeqCst);
        let key = app.store.key(id).await?;
        let mut map = self.map();
        match &key {
            Some(k) if generation == self.forgotten.load(std::sync::atomic::Ordering::SeqCst) => {
                if map.len() >= Self::MAX {
                    map.clear();
                }
                map.insert(id.to_owned(), (k.clone(), std::time::Instant::now()));
            }
            _ => {
                map.remove(id);
            }
        }
        Ok(key)
    }

    /// Drops key `id` (revoked through this server).
    pub(crate) fn forget(&self, id: &str) {
        let mut map = self.map();
        self.forgotten
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        map.remove(id);
    }
}

/// Bytes from the operating system's random source.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the OS random source works");
    bytes
}

/// A fresh key and its public id.
pub(crate) fn generate_key() -> (String, String) {
    let bytes = random_bytes::<22>();
    let id = hex::encode(&bytes[..6]);
    let secret = hex::encode(&bytes[6..]);
    (id.clone(), format!("wasq_{id}_{secret}"))
}

/// The id part of a well-formed key.
pub(crate) fn key_id(key: &str) -> Option<&str> {
    let rest = key.strip_prefix("wasq_")?;
    let (id, secret) = rest.split_once('_')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, 12) && hex(secret, 32)).then_some(id)
}

fn unauthorized(message: &str) -> Response {
    let mut resp = ApiError {
        status: StatusCode::UNAUTHORIZED,
        code: "unauthorized",
        message: message.into(),
        retry_after_ms: None,
    }
    .into_response();
    resp.headers_mut().insert(
        axum::http::header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    resp
}

/// Resolves the caller from the bearer key and stores it in the request's extensions;
/// answers 401 for a missing, malformed, unknown or revoked key.
pub(crate) async fn authenticate(
    State(app): State<Arc<App>>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(key) = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
    else {
        return unauthorized("an API key is required: Authorization: Bearer KEY");
    };
    let caller = match caller_for_key(&app, key).await {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// Who `key` is (the API's bearer key, or the dashboard's session cookie): the operator,
/// or a tenant through a key that is neither unknown nor revoked; else the 401 to answer.
pub(crate) async fn caller_for_key(app: &App, key: &str) -> Result<Caller, Response> {
    if app.keyring.is_admin(key) {
        return Ok(Caller::Admin);
    }
    let Some(id) = key_id(key) else {
        return Err(unauthorized("the API key is malformed"));
    };
    let stored = app
        .keys
        .get(app, id)
        .await
        .map_err(|e| ApiError::from(e).into_response())?;
    match stored {
        Some(k) if app.keyring.matches(key, &k.hmac) => {
            if k.revoked_at.is_some() {
                return Err(unauthorized("the API key was revoked"));
            }
            Ok(Caller::Tenant {
                tenant: k.tenant,
                key_id: k.id,
            })
        }
        _ => Err(unauthorized("the API key is not valid")),
    }
}

/// The tenant a tenant route acts for: the caller's, from its key. The operator key is
/// refused on these routes (403): it manages tenants and keys, it does not run jobs.
#[derive(Debug, Clone)]
pub(crate) struct TenantScope {
    pub tenant: String,
    pub caller: Caller,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for TenantScope {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<Caller>() {
            Some(caller @ Caller::Tenant { tenant, .. }) => Ok(TenantScope {
                tenant: tenant.clone(),
                caller: caller.clone(),
            }),
            Some(Caller::Admin) => Err(ApiError {
                status: StatusCode::FORBIDDEN,
                code: "forbidden",
                message:
                    "this route needs a tenant's key; the operator key manages tenants and keys"
                        .into(),
                retry_after_ms: None,
            }),
            None => Err(ApiError {
                status: StatusCode::UNAUTHORIZED,
                code: "unauthorized",
                message: "an API key is required: Authorization: Bearer KEY".into(),
                retry_after_ms: None,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_a_public_id_and_128_secret_bits() {
        let (id, key) = generate_key();
        assert_eq!(key_id(&key), Some(id.as_str()));
        assert_eq!(key.len(), "wasq_".len() + 12 + 1 + 32);
        assert_ne!(generate_key().1, key);
        for bad in [
            "",
            "wasq_",
            "wasq_abc_def",
            "Bearer x",
            &key[..key.len() - 1],
        ] {
            assert_eq!(key_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn hmac_matches_only_the_same_key_and_secret() {
        let ring = Keyring::new(b"secret one", Some("operator"));
        let (_, key) = generate_key();
        let stored = ring.hmac_hex(&key);
        assert!(ring.matches(&key, &stored));
        assert!(!ring.matches(&generate_key().1, &stored));
        assert!(!Keyring::new(b"secret two", None).matches(&key, &stored));
        assert!(!ring.matches(&key, "not hex"));
        assert!(ring.is_admin("operator"));
        assert!(!ring.is_admin("operator "));
        assert!(!Keyring::new(b"s", None).is_admin(""));
    }
}
