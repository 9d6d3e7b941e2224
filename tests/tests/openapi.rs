//! The OpenAPI document and its reference page (issue 16), from the real daemon: the
//! document validates as OpenAPI 3 (`openapi-spec-validator`, from PyPI by
//! `tests/setup.sh`) and says what the server does; `/docs` is served whole from the
//! binary, with nothing fetched from another site. That every route is documented is
//! checked by the server's own test (`host/server/src/openapi/tests.rs`).

use std::process::Command;

use serde_json::Value;
use wasq_tests::*;

/// The document, as a client without a key gets it.
async fn document(d: &Daemon) -> Value {
    let anonymous = d.api.as_key(None);
    let resp = anonymous
        .http
        .get(format!("{}/v1/openapi.json", anonymous.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    resp.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_validates_as_openapi_3() {
    let d = Daemon::start().await;
    let doc = document(&d).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let out = Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(&file)
        .output()
        .expect("python3 runs (tests/setup.sh installs openapi-spec-validator)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !said.contains("No module named"),
        "openapi-spec-validator is missing: run tests/setup.sh\n{said}"
    );
    assert!(out.status.success(), "the document is not valid:\n{said}");
    assert!(said.contains("OK"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_says_what_the_server_does() {
    let d = Daemon::start().await;
    let doc = document(&d).await;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{doc}");
    assert_eq!(doc["info"]["title"], "wasq");

    // A run by id: GET with its `id` path parameter, answered as the run's view or the
    // one error shape, and a tenant's key.
    let op = &doc["paths"]["/v1/runs/{id}"]["get"];
    let params = op["parameters"].as_array().expect("parameters");
    assert!(
        params
            .iter()
            .any(|p| p["name"] == "id" && p["in"] == "path" && p["required"] == true),
        "{op}"
    );
    assert_eq!(op["security"], serde_json::json!([{ "tenant_key": [] }]));
    assert_eq!(
        op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/RunView"
    );
    assert_eq!(
        op["responses"]["404"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/ErrorBody"
    );

    // The bearer schemes: a tenant's key and the operator's.
    for key in ["tenant_key", "operator_key"] {
        let scheme = &doc["components"]["securitySchemes"][key];
        assert_eq!(scheme["type"], "http", "{key}: {scheme}");
        assert_eq!(scheme["scheme"], "bearer", "{key}: {scheme}");
    }
    assert_eq!(
        doc["paths"]["/v1/tenants"]["post"]["security"],
        serde_json::json!([{ "operator_key": [] }])
    );
    // Public routes name no key.
    assert!(doc["paths"]["/healthz"]["get"].get("security").is_none());
    assert!(
        doc["paths"]["/v1/openapi.json"]["get"]
            .get("security")
            .is_none()
    );

    // Query parameters of a listing, and a deploy's body.
    let list = doc["paths"]["/v1/runs"]["get"]["parameters"]
        .as_array()
        .unwrap();
    for name in ["function", "status", "parent", "limit"] {
        assert!(
            list.iter().any(|p| p["name"] == name && p["in"] == "query"),
            "GET /v1/runs has no query parameter {name}"
        );
    }
    let body = &doc["paths"]["/v1/functions/{name}"]["put"]["requestBody"];
    assert_eq!(
        body["content"]["application/wasm"]["schema"]["format"], "binary",
        "{body}"
    );

    // The error shape the document gives is the one the server answers.
    let detail = &doc["components"]["schemas"]["ErrorDetail"];
    assert_eq!(
        detail["required"],
        serde_json::json!(["code", "message"]),
        "{detail}"
    );
    let (status, answer) = d.api.get("/v1/runs/0123abcd").await;
    assert_eq!(status, 404, "{answer}");
    let error = answer["error"].as_object().expect("an error object");
    let mut fields: Vec<_> = error.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(fields, ["code", "message"], "{answer}");

    // Each documented answer's schema names a component that exists.
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for name in [
        "Run",
        "RunView",
        "Listed",
        "Function",
        "StepInfo",
        "LogLine",
        "QueueDepth",
        "Tenant",
    ] {
        assert!(schemas.contains_key(name), "no schema {name}");
    }
}

/// The `src` and `href` attribute values of an HTML page.
fn references(html: &str) -> Vec<String> {
    let mut out = vec![];
    for attr in ["src=\"", "href=\""] {
        let mut rest = html;
        while let Some(at) = rest.find(attr) {
            rest = &rest[at + attr.len()..];
            let end = rest.find('"').unwrap();
            out.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
    }
    out
}

fn is_external(reference: &str) -> bool {
    let r = reference.trim().to_ascii_lowercase();
    r.starts_with("http:") || r.starts_with("https:") || r.starts_with("//")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_page_is_served_whole_from_the_binary() {
    let d = Daemon::start().await;
    let anonymous = d.api.as_key(None);
    let get = |path: String| {
        let http = anonymous.http.clone();
        let url = format!("{}{path}", anonymous.base);
        async move {
            let resp = http.get(&url).send().await.unwrap();
            let status = resp.status().as_u16();
            let kind = resp
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let body = resp.text().await.unwrap();
            (status, kind, body, url)
        }
    };

    // `/docs` redirects to `/docs/` (reqwest follows it), the page itself.
    let (status, kind, page, _) = get("/docs".into()).await;
    assert_eq!(status, 200, "{page}");
    assert!(kind.starts_with("text/html"), "{kind}");
    assert!(page.contains("id=\"swagger-ui\""), "{page}");

    let refs = references(&page);
    for script in [
        "swagger-ui-bundle.js",
        "swagger-ui-standalone-preset.js",
        "swagger-initializer.js",
        "swagger-ui.css",
    ] {
        assert!(
            refs.iter().any(|r| r.ends_with(script)),
            "the page does not load {script}: {refs:?}"
        );
    }
    for r in &refs {
        assert!(!is_external(r), "the page loads {r} from another site");
        let path = format!("/docs/{}", r.trim_start_matches("./"));
        let (status, _, body, url) = get(path).await;
        assert_eq!(status, 200, "{url}");
        assert!(!body.is_empty(), "{url} is empty");
        if r.ends_with(".css") {
            // Stylesheets fetch nothing from elsewhere either (data: URIs only).
            let lower = body.to_ascii_lowercase();
            assert!(
                !lower.contains("url(http")
                    && !lower.contains("url(\"http")
                    && !lower.contains("url('http")
                    && !lower.contains("@import"),
                "{url} fetches from another site"
            );
        }
    }

    // The initializer points the page at this server's document and turns off the online
    // validator badge (which would send the document to validator.swagger.io).
    let (status, _, init, url) = get("/docs/swagger-initializer.js".into()).await;
    assert_eq!(status, 200, "{url}");
    assert!(init.contains("\"/v1/openapi.json\""), "{init}");
    assert!(init.contains("\"validatorUrl\": \"none\""), "{init}");
    assert!(
        !init.contains("http://") && !init.contains("https://"),
        "{init}"
    );
}
