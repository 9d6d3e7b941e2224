//! The operator verbs: `tenants` and `keys`, with the operator key.

use super::*;

pub(crate) async fn tenants(client: Client, cmd: TenantsCommand) -> Result<ExitCode> {
    match cmd {
        TenantsCommand::Create {
            name,
            max_running,
            max_queued,
            max_stored_bytes,
            max_run_bytes,
            max_run_log_bytes,
            output,
        } => {
            let mut body = serde_json::json!({ "name": name });
            let mut quotas = serde_json::Map::new();
            if let Some(n) = max_running {
                quotas.insert("max_running".into(), n.into());
            }
            for (key, n) in [
                ("max_queued", max_queued),
                ("max_stored_bytes", max_stored_bytes),
                ("max_run_bytes", max_run_bytes),
                ("max_run_log_bytes", max_run_log_bytes),
            ] {
                if let Some(n) = n {
                    quotas.insert(key.into(), n.into());
                }
            }
            if !quotas.is_empty() {
                body["quotas"] = Value::Object(quotas);
            }
            let t = client.post_json("/v1/tenants", body.to_string()).await?;
            match output {
                Output::Json => outln!("{}", out::json(&t, true)),
                Output::Table => {
                    let name = out::field(&t["name"]);
                    outln!(
                        "created tenant {name}; give it a key with `wasq keys create --tenant {name}`"
                    )
                }
            }
        }
        TenantsCommand::List { output } => {
            views::tenants(&client.get("/v1/tenants", &[]).await?, output)
        }
        TenantsCommand::Show { name, output } => {
            let path = format!("/v1/tenants/{}", client::path_segment(&name));
            views::tenants(&client.get(&path, &[]).await?, output)
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn keys(client: Client, cmd: KeysCommand) -> Result<ExitCode> {
    let base = |tenant: &str| format!("/v1/tenants/{}/keys", client::path_segment(tenant));
    match cmd {
        KeysCommand::Create {
            tenant,
            label,
            output,
        } => {
            let body = serde_json::json!({ "label": label }).to_string();
            let k = client.post_json(&base(&tenant), body).await?;
            match output {
                Output::Json => outln!("{}", out::json(&k, true)),
                Output::Table => outln!("{}", out::field(&k["key"])),
            }
            errln!(
                "key {} for tenant {}: shown once, stored only as an HMAC; keep it safe",
                out::field(&k["id"]),
                out::line(&tenant, out::SHORT)
            );
        }
        KeysCommand::List { tenant, output } => {
            views::keys(&client.get(&base(&tenant), &[]).await?, output);
        }
        KeysCommand::Revoke { tenant, id, output } => {
            let path = format!("{}/{}/revoke", base(&tenant), client::path_segment(&id));
            let answer = client.post_json(&path, String::new()).await?;
            if let Output::Json = output {
                outln!("{}", out::json(&answer, true));
                return Ok(ExitCode::SUCCESS);
            }
            outln!(
                "revoked key {} of tenant {}",
                out::line(&id, out::SHORT),
                out::line(&tenant, out::SHORT)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
