//! The audit trail records what was done, not what was tried: an action the server
//! refuses (400, 403, 404, 409) leaves no entry, and one that succeeds leaves exactly one,
//! written after it took effect. (Schedule actions are covered with the scheduler.)

use std::time::Duration;

use serde_json::Value;
use wasq_tests::{Api, Daemon, guest};

const WAIT: Duration = Duration::from_secs(60);

/// The trail as last seen, to tell what each action added.
struct Trail<'a> {
    d: &'a Daemon,
    len: usize,
}

impl Trail<'_> {
    /// The whole trail, newest first.
    async fn entries(&self) -> Vec<Value> {
        let (status, body) = self.d.admin.get("/v1/audit?limit=1000").await;
        assert_eq!(status, 200, "{body}");
        body.as_array().unwrap().clone()
    }

    /// Checks an action's answer `got` has `status`, and that the trail grew by `entry`
    /// (action, start of the target) or, with `None`, not at all.
    async fn expect(
        &mut self,
        what: &str,
        status: u16,
        got: (u16, Value),
        entry: Option<(&str, &str)>,
    ) {
        assert_eq!(got.0, status, "{what}: {}", got.1);
        let after = self.entries().await;
        match entry {
            None => assert_eq!(
                after.len(),
                self.len,
                "{what} left an entry: {:#}",
                after[0]
            ),
            Some((action, target)) => {
                assert_eq!(
                    after.len(),
                    self.len + 1,
                    "{what}: exactly one entry: {after:#?}"
                );
                assert_eq!(after[0]["action"], action, "{what}: {:#}", after[0]);
                assert!(
                    after[0]["target"].as_str().unwrap().starts_with(target),
                    "{what}: {:#}",
                    after[0]
                );
            }
        }
        self.len = after.len();
    }
}

#[tokio::test]
async fn only_actions_that_succeeded_are_audited_once() {
    let d = Daemon::start().await;
    let api: &Api = &d.api;
    let mut t = Trail { d: &d, len: 0 };
    t.len = t.entries().await.len();

    // Deploys.
    let got = api.put("/v1/functions/w", b"not wasm".to_vec()).await;
    t.expect("deploy of garbage", 400, got, None).await;
    let got = api
        .put("/v1/functions/w?timeout_ms=0", guest("waiter"))
        .await;
    t.expect("deploy with bad settings", 400, got, None).await;
    let got = api.put("/v1/functions/w", guest("waiter")).await;
    t.expect("deploy", 201, got, Some(("deploy", "w "))).await;
    let got = api.put("/v1/functions/echo", guest("echo")).await;
    t.expect("deploy echo", 201, got, Some(("deploy", "echo ")))
        .await;

    // Cancel and retry.
    let waiting = api.start_run("w", r#"{"event": "never"}"#).await;
    api.wait_until(&waiting, WAIT, |r| r["status"] == "waiting")
        .await;
    let done = api.start_run("echo", "{}").await;
    api.wait_run(&done, WAIT).await;
    let got = api.post("/v1/runs/nope/cancel", "").await;
    t.expect("cancel of an unknown run", 404, got, None).await;
    let got = api.post(&format!("/v1/runs/{done}/cancel"), "").await;
    t.expect("cancel of an ended run", 409, got, None).await;
    let got = api
        .post(&format!("/v1/runs/{done}/cancel?cascade=maybe"), "")
        .await;
    t.expect("cancel with a bad query", 400, got, None).await;
    let got = api.post(&format!("/v1/runs/{waiting}/retry"), "").await;
    t.expect("retry of a waiting run", 409, got, None).await;
    let got = api.post(&format!("/v1/runs/{waiting}/cancel"), "").await;
    t.expect("cancel", 200, got, Some(("run.cancel", &waiting)))
        .await;
    let got = api.post(&format!("/v1/runs/{waiting}/cancel"), "").await;
    t.expect("cancel twice", 409, got, None).await;
    let got = api.post(&format!("/v1/runs/{done}/retry"), "").await;
    t.expect("retry of a succeeded run", 409, got, None).await;
    let got = api.post("/v1/runs/nope/retry", "").await;
    t.expect("retry of an unknown run", 404, got, None).await;
    let got = api.post(&format!("/v1/runs/{waiting}/retry"), "").await;
    t.expect("retry", 200, got, Some(("run.retry", &waiting)))
        .await;
    let got = api.post(&format!("/v1/runs/{waiting}/retry"), "").await;
    t.expect("retry of a run queued again", 409, got, None)
        .await;

    // Tenants and quotas.
    let got = api.post("/v1/tenants", r#"{"name": "sneaky"}"#).await;
    t.expect("tenant created by a tenant", 403, got, None).await;
    let got = d.admin.post("/v1/tenants", r#"{"name": "Bad Name"}"#).await;
    t.expect("tenant with a bad name", 400, got, None).await;
    let got = d.admin.post("/v1/tenants", r#"{"name": "acme"}"#).await;
    t.expect("tenant", 201, got, Some(("tenant.create", "acme")))
        .await;
    let got = d.admin.post("/v1/tenants", r#"{"name": "acme"}"#).await;
    t.expect("tenant twice", 409, got, None).await;
    let quotas = br#"{"max_running": 2}"#.to_vec();
    let got = d.admin.put("/v1/tenants/nope/quotas", quotas.clone()).await;
    t.expect("quotas of an unknown tenant", 404, got, None)
        .await;
    let got = d.admin.put("/v1/tenants/acme/quotas", b"{".to_vec()).await;
    t.expect("quotas that are not JSON", 400, got, None).await;
    let got = api.put("/v1/tenants/default/quotas", quotas.clone()).await;
    t.expect("quotas set by a tenant", 403, got, None).await;
    let got = d.admin.put("/v1/tenants/acme/quotas", quotas).await;
    t.expect("quotas", 200, got, Some(("tenant.quotas", "{")))
        .await;

    // Keys.
    let got = d
        .admin
        .post("/v1/tenants/acme/keys", "{\"label\": \"a\\u001bb\"}")
        .await;
    t.expect("key with a control character in its label", 400, got, None)
        .await;
    let got = api.post("/v1/tenants/acme/keys", "{}").await;
    t.expect("key of another tenant", 404, got, None).await;
    let got = d.admin.post("/v1/tenants/acme/keys", "{}").await;
    let id = got.1["id"].as_str().unwrap_or_default().to_owned();
    t.expect("key", 201, got, Some(("key.create", &id))).await;
    let got = d
        .admin
        .post("/v1/tenants/acme/keys/000000000000/revoke", "")
        .await;
    t.expect("revoke of an unknown key", 404, got, None).await;
    let got = api
        .post(&format!("/v1/tenants/acme/keys/{id}/revoke"), "")
        .await;
    t.expect("revoke of another tenant's key", 404, got, None)
        .await;
    let revoke = format!("/v1/tenants/acme/keys/{id}/revoke");
    let got = d.admin.post(&revoke, "").await;
    t.expect("revoke", 200, got, Some(("key.revoke", &id)))
        .await;
    let got = d.admin.post(&revoke, "").await;
    t.expect("revoke of a revoked key (changes nothing)", 200, got, None)
        .await;

    d.stop().await;
}
